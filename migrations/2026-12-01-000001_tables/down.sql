-- Removes every table and with it all lease state, including fencing
-- epochs: a re-install starts every key fresh at epoch 1.
DROP TABLE IF EXISTS lease.prune_sightings;
DROP TABLE IF EXISTS lease.waiters;
DROP TABLE IF EXISTS lease.guards;
DROP TABLE IF EXISTS lease.lineage;
DROP TABLE IF EXISTS lease.namespace_changes;
DROP TABLE IF EXISTS lease.namespaces;
DROP TABLE IF EXISTS lease.leases;
DROP TABLE IF EXISTS lease.groups;
DROP FUNCTION IF EXISTS lease._drop_default_grants();
DROP DOMAIN IF EXISTS lease.lease_epoch;
DROP DOMAIN IF EXISTS lease.lease_name;
-- The schema goes only when nothing else lives in it (leasehold's own install
-- bookkeeping is dropped by the installer after the last down migration).
DROP SCHEMA IF EXISTS lease RESTRICT;
