//! leasehold's integration tests: one binary, modules mirroring docs/SPECIFICATION.md.
//! Every test runs against a real PostgreSQL (a throwaway local server, or
//! the one `DATABASE_URL` names).

#[cfg(feature = "async")]
mod aio_client;
#[cfg(feature = "async")]
mod aio_common;
#[cfg(feature = "async")]
mod aio_holders;
#[cfg(feature = "async")]
mod aio_work;
mod attacks;
mod common;
mod concurrency;
#[cfg(feature = "async")]
mod connect_bounds;
mod election;
#[cfg(feature = "async")]
mod error_kinds;
mod faces;
mod fenced_table_attacks;
mod fenced_tables;
mod groups;
mod guard_contract;
mod holders;
mod install;
mod layout;
mod listing;
mod lock_order;
mod many_keys;
mod namespaces;
mod pg_lease_examples;
mod pool_client;
mod poolers;
mod pruning;
mod release_watch;
#[cfg(feature = "async")]
mod same_sql;
mod security;
mod spec_1_1_state;
mod spec_1_2_epochs;
mod spec_1_3_functions;
mod spec_1_4_errors;
mod spec_1_5_transactions;
mod spec_2_guards;
mod sql_holes;
mod sql_rules;
mod sql_states;
mod sql_suites;
mod waiting_security;
