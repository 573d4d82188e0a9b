-- Removes the functions of pruning (up.sql), newest first.
DROP FUNCTION IF EXISTS lease.prune_guards(interval, bytea, integer, boolean);
DROP FUNCTION IF EXISTS lease.prune_keys(interval, bytea, integer, boolean);
DROP FUNCTION IF EXISTS lease._check_prune_input(text, interval, integer);
