-- The batch calls (docs/SPECIFICATION.md §1.9): renew_many and
-- release_many answer per key, in the order asked; join_group and
-- renew_group keep a heartbeat group alive with one row write.
\set SHOW_CONTEXT never

SELECT acquired, epoch FROM lease.acquire('b/1', 'w', interval '1 min');
SELECT acquired, epoch FROM lease.acquire('b/2', 'w', interval '1 min');
SELECT acquired, epoch FROM lease.acquire('b/3', 'other', interval '1 min');

-- Each key gets the status a single renew would give it.
SELECT key, status, expires_at IS NOT NULL AS has_expiry
  FROM lease.renew_many(ARRAY['b/1', 'b/2', 'b/3', 'b/never'], 'w', ARRAY[1, 2, 1, 1]::bigint[], interval '1 min');

-- A heartbeat group: joined keys renew together.
SELECT key, status, group_id IS NOT NULL AS grouped
  FROM lease.join_group(ARRAY['b/1'], 'w', ARRAY[1]::bigint[], interval '1 min');
SELECT status, members FROM lease.renew_group(
    (SELECT group_id FROM lease.leases WHERE key = 'b/1'), 'w', interval '1 min');
SELECT status, members FROM lease.renew_group(
    (SELECT group_id FROM lease.leases WHERE key = 'b/1'), 'other', interval '1 min');

SELECT key, status
  FROM lease.release_many(ARRAY['b/1', 'b/2', 'b/3'], 'w', ARRAY[1, 1, 1]::bigint[]);
SELECT key, held, epoch FROM unnest(ARRAY['b/1', 'b/2', 'b/3']) AS key,
       LATERAL lease.inspect(key) ORDER BY key;

-- The arrays must agree in length, hold no NULL and name a key once; an
-- empty batch answers nothing.
SELECT * FROM lease.renew_many(ARRAY['b/1', 'b/2'], 'w', ARRAY[1]::bigint[], interval '1 min');
SELECT * FROM lease.renew_many(ARRAY['b/1', NULL], 'w', ARRAY[1, 1]::bigint[], interval '1 min');
SELECT * FROM lease.release_many(ARRAY['b/1', 'b/1'], 'w', ARRAY[1, 1]::bigint[]);
SELECT * FROM lease.renew_many(ARRAY[]::text[], 'w', ARRAY[]::bigint[], interval '1 min');
