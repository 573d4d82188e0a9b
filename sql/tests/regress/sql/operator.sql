-- Operator actions (docs/SPECIFICATION.md §3, §4): force_release,
-- list_leases, the namespace rules, the generation and pruning. Granted to
-- nobody by default; run here as the installing superuser, with an
-- ordinary role to show what the rules do to it. Last in the schedule: it
-- raises the generation, which moves every later epoch.
\set SHOW_CONTEXT never

SELECT acquired, epoch FROM lease.acquire('op/a', 'w', interval '1 min');
SELECT acquired, epoch FROM lease.acquire('op/b', 'w', interval '1 min');

-- force_release: ends a grant whoever holds it and answers the counter;
-- its holder's renew then says not_owner, and why_refused says why.
SELECT lease.force_release('op/a');
SELECT state, epoch, ended FROM lease.key_state('op/a');
SELECT * FROM lease.why_refused('op/a', 'w', 1);
-- The form with an epoch ends only that grant.
SELECT * FROM lease.force_release('op/b', 7);
SELECT * FROM lease.force_release('op/b', 1);

-- list_leases: every key of a prefix, with its state.
SELECT acquired FROM lease.acquire('op/c', 'w', interval '1 min');
SELECT key, state, owner, epoch
  FROM lease.list_leases('op/', NULL, ARRAY['held', 'lapsed', 'free'], 'key', 100);
SELECT key, state FROM lease.list_leases('op/', 'w', ARRAY['held'], 'key', 100);

-- Namespace rules: a prefix bound to a role is that role's alone.
CREATE ROLE lh_regress_app;
CREATE ROLE lh_regress_other;
GRANT lh_regress_app, lh_regress_other TO current_user;
SELECT lease.bind_namespace('ns/app/', 'lh_regress_app');
SELECT prefix, role FROM lease.list_namespaces();
SET SESSION AUTHORIZATION lh_regress_other;
SELECT * FROM lease.acquire('ns/app/job', 'intruder', interval '1 min');
SELECT acquired, epoch FROM lease.acquire('ns/free/job', 'other', interval '1 min');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION lh_regress_app;
SELECT acquired, epoch FROM lease.acquire('ns/app/job', 'app', interval '1 min');
RESET SESSION AUTHORIZATION;
SELECT lease.unbind_namespace('ns/app/');
SELECT lease.unbind_namespace('ns/app/');
DROP ROLE lh_regress_app;
DROP ROLE lh_regress_other;

-- The generation: raised past every epoch (after a restore, say), it
-- puts every later grant above it; it never goes down.
SELECT generation FROM lease.generation();
SELECT lease.raise_generation(2);
SELECT generation FROM lease.generation();
SELECT acquired, epoch = (2::bigint << 40) + 1 AS above_the_floor
  FROM lease.acquire('op/after-raise', 'w', interval '1 min');
SELECT lease.raise_generation(1);

-- Pruning: keys idle past the limit go, held ones stay (a dry run first).
SELECT acquired FROM lease.acquire('op/idle', 'w', interval '10 ms');
SELECT pg_sleep(0.05);
SELECT pruned >= 1 AS would_prune FROM lease.prune_keys(interval '20 ms', dry_run => true);
SELECT count(*) FROM lease.inspect('op/idle');
SELECT pruned >= 1 AS pruned FROM lease.prune_keys(interval '20 ms');
SELECT count(*) FROM lease.inspect('op/idle');
SELECT count(*) FROM lease.inspect('op/c');
