-- The pg_lease quick start and its examples, as leasehold answers them.
-- Times are the server's; only their relations are printed.
\set SHOW_CONTEXT never

-- Acquire (non-blocking by default).
SELECT acquired, epoch, expires_at > now() AS expires_later
  FROM lease.acquire('job-42', 'worker-a1', interval '30s');

-- Heartbeat: extend the expiry, the epoch unchanged.
SELECT status, expires_at > now() + interval '29s' AS extended
  FROM lease.renew('job-42', 'worker-a1', 1, interval '30s');

-- Voluntary release: the key's counter moves past the released epoch.
SELECT status FROM lease.release('job-42', 'worker-a1', 1);

-- Observe the state: free, its counter exposed.
SELECT held, owner, epoch, expires_at FROM lease.inspect('job-42');

-- Example 1: a duplicate acquire returns the same epoch.
SELECT acquired, epoch FROM lease.acquire('job-42', 'worker-a1', interval '30s');
SELECT acquired, epoch FROM lease.acquire('job-42', 'worker-a1', interval '30s');
SELECT status FROM lease.release('job-42', 'worker-a1', 3);

-- Example 2: takeover of a holder that stopped renewing. a1's one-second
-- grant lapses while b2 waits (up to five seconds) and takes over with a
-- new epoch.
SELECT acquired, epoch FROM lease.acquire('job-42', 'worker-a1', interval '1s');
SELECT acquired, epoch FROM lease.acquire('job-42', 'worker-b2', interval '30s', interval '5s');

-- Example 3: the old owner is fenced: its renew says lapsed.
SELECT status FROM lease.renew('job-42', 'worker-a1', 5, interval '30s');

-- Example 4: inspect as a fencing watermark.
SELECT held, owner, epoch FROM lease.inspect('job-42');
SELECT status FROM lease.release('job-42', 'worker-b2', 6);
SELECT held, owner, epoch FROM lease.inspect('job-42');

-- Example 5: distinct keys never interact.
SELECT acquired, epoch FROM lease.acquire('job-43', 'worker-a1', interval '30s');
SELECT held, owner, epoch FROM lease.inspect('job-42');

-- A never-leased key: no row, unlike a released one.
SELECT count(*) FROM lease.inspect('job-never');
