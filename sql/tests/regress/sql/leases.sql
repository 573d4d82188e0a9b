-- lease.acquire, renew, release, inspect, key_state and why_refused: the
-- statuses and their precedence, idempotence, counters, and the input
-- rules (docs/SPECIFICATION.md §1.3, §1.4).
\set SHOW_CONTEXT never

-- A grant; the same owner again gets the same grant.
SELECT acquired, epoch FROM lease.acquire('l/a', 'o1', interval '1 min');
SELECT acquired, epoch FROM lease.acquire('l/a', 'o1', interval '1 min');
-- Another owner is denied, with no epoch and no expiry.
SELECT acquired, epoch, expires_at FROM lease.acquire('l/a', 'o2', interval '1 min');

-- renew and release statuses, in precedence: the holder, then the lapse,
-- then the epoch.
SELECT status FROM lease.renew('l/a', 'o2', 1, interval '1 min');       -- not_owner
SELECT status FROM lease.renew('l/a', 'o1', 2, interval '1 min');       -- epoch_mismatch
SELECT status FROM lease.renew('l/never', 'o1', 1, interval '1 min');   -- not_owner
SELECT status FROM lease.release('l/a', 'o1', 2);                       -- epoch_mismatch
SELECT status FROM lease.release('l/a', 'o2', 1);                       -- not_owner
-- why_refused says more than the status.
SELECT * FROM lease.why_refused('l/a', 'o1', 2);
SELECT * FROM lease.why_refused('l/a', 'o2', 1);

-- The renew extends; the epoch stays.
SELECT status, expires_at > now() + interval '50 s' AS extended
  FROM lease.renew('l/a', 'o1', 1, interval '1 min');
SELECT held, owner, epoch FROM lease.inspect('l/a');
SELECT state, owner, epoch, ended FROM lease.key_state('l/a');

-- A release frees the key and moves its counter; a second release of the
-- same grant is not_owner, and the counter does not move again.
SELECT status FROM lease.release('l/a', 'o1', 1);
SELECT status FROM lease.release('l/a', 'o1', 1);
SELECT held, owner, epoch FROM lease.inspect('l/a');
SELECT state, owner, epoch, ended FROM lease.key_state('l/a');
SELECT * FROM lease.why_refused('l/a', 'o1', 1);

-- A lapse: the grant's expiry passed. renew and release say lapsed;
-- key_state tells lapsed from free; the next grant has a higher epoch.
SELECT acquired, epoch FROM lease.acquire('l/b', 'o1', interval '10 ms');
SELECT pg_sleep(0.05);
SELECT status FROM lease.renew('l/b', 'o1', 1, interval '1 min');
SELECT status FROM lease.release('l/b', 'o1', 1);
SELECT held, owner, epoch FROM lease.inspect('l/b');
SELECT state, owner, epoch, ended FROM lease.key_state('l/b');
SELECT * FROM lease.why_refused('l/b', 'o1', 1);
SELECT acquired, epoch FROM lease.acquire('l/b', 'o2', interval '1 min');
SELECT status FROM lease.renew('l/b', 'o1', 1, interval '1 min');      -- still lapsed: taken over
SELECT * FROM lease.why_refused('l/b', 'o1', 1);

-- A waiting acquire that runs out raises 57014 (query_canceled), unlike
-- a denial, and changes nothing.
SELECT lh_test.raised($$SELECT lease.acquire('l/b', 'o3', interval '1 min', interval '100 ms')$$);
SELECT held, owner, epoch FROM lease.inspect('l/b');

-- A call rolled back with its transaction leaves no trace.
BEGIN;
SELECT acquired, epoch FROM lease.acquire('l/c', 'o1', interval '1 min');
ROLLBACK;
SELECT count(*) FROM lease.inspect('l/c');

-- Invalid input: 22023 invalid_input with every violation named, and
-- nothing changed.
SELECT lh_test.raised($$SELECT * FROM lease.acquire(NULL, 'o1', interval '1 min')$$);
SELECT lh_test.raised($$SELECT * FROM lease.acquire('', '', interval '0')$$);
SELECT lh_test.raised($$SELECT * FROM lease.acquire('l/d', 'o1', interval '-1 s')$$);
SELECT lh_test.raised($$SELECT * FROM lease.acquire('l/d', 'o1', interval '1 min', interval '-1 s')$$);
SELECT lh_test.raised($$SELECT * FROM lease.acquire('l/d', 'o1', interval '1 min', NULL)$$);
SELECT lh_test.raised($$SELECT * FROM lease.acquire('l/d', 'o1', interval '200 years')$$);
SELECT lh_test.raised($$SELECT * FROM lease.acquire(repeat('k', 16385), 'o1', interval '1 min')$$);
SELECT lh_test.raised($$SELECT * FROM lease.renew('l/a', 'o1', NULL, interval '1 min')$$);
SELECT lh_test.raised($$SELECT * FROM lease.renew('l/a', 'o1', 1, NULL)$$);
SELECT lh_test.raised($$SELECT * FROM lease.release('l/a', NULL, 1)$$);
SELECT lh_test.raised($$SELECT * FROM lease.inspect('')$$);
SELECT count(*) FROM lease.inspect('l/d');
