-- Removes the prune functions and the sightings. The watermark
-- (lease.lineage.pruned_through) and the first epochs
-- (lease.leases.first_epoch) belong to migration 2026-11-30-000001 and stay:
-- they keep every key that comes back above the epochs it had.
DROP FUNCTION IF EXISTS lease.prune_guards(interval, bytea, integer, boolean);
DROP FUNCTION IF EXISTS lease.prune_keys(interval, bytea, integer, boolean);
DROP FUNCTION IF EXISTS lease._check_prune_input(text, interval, integer);
DROP FUNCTION IF EXISTS lease._prune_violations(interval, integer);
DROP TABLE IF EXISTS lease.prune_sightings;
