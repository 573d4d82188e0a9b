-- Removes the lease primitive and all lease state, including fencing epochs:
-- a re-install starts every key fresh at epoch 1.
DROP FUNCTION IF EXISTS lease.generation();
DROP FUNCTION IF EXISTS lease.inspect(text);
DROP FUNCTION IF EXISTS lease.release(text, text, bigint);
DROP FUNCTION IF EXISTS lease.renew(text, text, bigint, interval);
DROP FUNCTION IF EXISTS lease.acquire(text, text, interval, interval);
DROP FUNCTION IF EXISTS lease._on_release(bytea);
DROP FUNCTION IF EXISTS lease._check_release_input(text, text, bigint);
DROP FUNCTION IF EXISTS lease._check_renew_input(text, text, bigint, interval);
DROP FUNCTION IF EXISTS lease._max_generation();
DROP FUNCTION IF EXISTS lease._generation(boolean, boolean);
DROP FUNCTION IF EXISTS lease._timeline();
DROP FUNCTION IF EXISTS lease._raise_wait_timeout(text, interval, text);
DROP FUNCTION IF EXISTS lease._lock_budget(interval);
DROP FUNCTION IF EXISTS lease._status(bytea, text, text, bigint);
DROP FUNCTION IF EXISTS lease._raise_invalid(text, text[]);
DROP FUNCTION IF EXISTS lease._epoch_violations(text, bigint, bigint);
DROP FUNCTION IF EXISTS lease._wait_violations(interval);
DROP FUNCTION IF EXISTS lease._ttl_violations(interval);
DROP FUNCTION IF EXISTS lease._span_effect(interval);
DROP FUNCTION IF EXISTS lease._plain_wait(interval);
DROP FUNCTION IF EXISTS lease._plain_ttl(interval);
DROP FUNCTION IF EXISTS lease._text_violations(text, text);
DROP TABLE IF EXISTS lease.lineage;
DROP FUNCTION IF EXISTS lease._left_groups(bigint[]);
DROP FUNCTION IF EXISTS lease._live(lease.leases);
DROP FUNCTION IF EXISTS lease._expiry(lease.leases);
DROP FUNCTION IF EXISTS lease._group_expiry(bigint);
DROP TABLE IF EXISTS lease.groups;
DROP TABLE IF EXISTS lease.leases;
DROP FUNCTION IF EXISTS lease._raise_forbidden(text, text, text);
DROP FUNCTION IF EXISTS lease._allowed(text);
DROP FUNCTION IF EXISTS lease._allowed_by_rules(text);
DROP TABLE IF EXISTS lease.namespaces;
DROP FUNCTION IF EXISTS lease._key_hash(text);
-- The schema goes only when nothing else lives in it (leasehold's own install
-- bookkeeping is dropped by the installer after the last down migration).
DROP SCHEMA IF EXISTS lease RESTRICT;
