-- The database guards (docs/SPECIFICATION.md §2): a resource remembers
-- the highest epoch it accepted for its key and refuses anything lower.
\set SHOW_CONTEXT never

SELECT acquired, epoch FROM lease.acquire('g/job', 'w1', interval '1 min');

-- admit: accepts the epoch and raises the resource's floor to it.
SELECT lease.admit('g/table-1', 'g/job', 1);
SELECT * FROM lease.inspect_guard('g/table-1');
SELECT lease.admit('g/table-1', 'g/job', 1);          -- the same epoch again

-- check_held and admit_held: the lease itself must be held at that epoch.
SELECT lease.check_held('g/job', 'w1', 1) > now() AS held_until_later;
SELECT lease.admit_held('g/table-1', 'g/job', 'w1', 1) > now() AS admitted;
SELECT lease.check_held('g/job', 'w2', 1);
SELECT lease.admit_held('g/table-1', 'g/job', 'w1', 2);

-- renew_admit: a renew and an admission in one call.
SELECT lease.renew_admit('g/table-1', 'g/job', 'w1', 1, interval '1 min') > now() + interval '50 s' AS renewed;

-- A new holder's epoch raises the floor; the old epoch is then refused.
SELECT status FROM lease.release('g/job', 'w1', 1);
SELECT acquired, epoch FROM lease.acquire('g/job', 'w2', interval '1 min');
SELECT lease.admit_held('g/table-1', 'g/job', 'w2', 3) > now() AS admitted;
SELECT * FROM lease.inspect_guard('g/table-1');
SELECT lease.admit('g/table-1', 'g/job', 1);
SELECT lease.admit_held('g/table-1', 'g/job', 'w1', 1);

-- One resource, one key: a token of another key is refused.
SELECT acquired, epoch FROM lease.acquire('g/other', 'w1', interval '1 min');
SELECT lease.admit('g/table-1', 'g/other', 1);

-- fence: an operator raises the floor past a lapsed holder without a
-- grant, so its late write is refused; the answer is the new floor.
SELECT lease.fence('g/table-2', 'g/job', 3);
SELECT * FROM lease.inspect_guard('g/table-2');
SELECT lease.admit('g/table-2', 'g/job', 3);

-- A guard refusal rolls back the caller's transaction's writes.
CREATE TABLE g_writes (v text);
BEGIN;
INSERT INTO g_writes VALUES ('late');
SELECT lease.admit('g/table-1', 'g/job', 1);
COMMIT;
SELECT count(*) FROM g_writes;
DROP TABLE g_writes;

-- Input rules.
SELECT lease.admit('', 'g/job', 1);
SELECT lease.admit('g/table-1', 'g/job', 0);
SELECT * FROM lease.inspect_guard(NULL);
SELECT count(*) FROM lease.inspect_guard('g/never');
