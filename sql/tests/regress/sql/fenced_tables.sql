-- Fenced tables (docs/SPECIFICATION.md §2.1): a table that refuses every
-- write of a transaction that did not present a current token of its key,
-- whatever client sends it.
\set SHOW_CONTEXT never

CREATE TABLE f_jobs (id int PRIMARY KEY, v text);
SELECT lease.protect_table('f_jobs', 'f/jobs');
SELECT * FROM lease.fenced_tables();

-- Without a token, every kind of write is refused.
INSERT INTO f_jobs VALUES (1, 'no token');
UPDATE f_jobs SET v = 'x';
DELETE FROM f_jobs;
TRUNCATE f_jobs;

-- With the holder's token, in the same transaction, it is written.
SELECT acquired, epoch FROM lease.acquire('f/jobs', 'w1', interval '1 min');
BEGIN;
SELECT lease.present('f/jobs', 'w1', 1);
INSERT INTO f_jobs VALUES (1, 'w1');
COMMIT;
-- A token lasts one transaction.
INSERT INTO f_jobs VALUES (2, 'next transaction');

-- Taken over: the old holder's token is refused.
SELECT lease.force_release('f/jobs');
SELECT acquired, epoch FROM lease.acquire('f/jobs', 'w2', interval '1 min');
BEGIN;
SELECT lease.present('f/jobs', 'w1', 1);
UPDATE f_jobs SET v = 'late';
ROLLBACK;
BEGIN;
SELECT lease.present('f/jobs', 'w2', 3);
UPDATE f_jobs SET v = 'w2';
COMMIT;
SELECT * FROM f_jobs;

-- Row fences: each row by the key its columns name.
CREATE TABLE f_tenants (tenant int, v text);
SELECT lease.protect_rows('f_tenants', 'f/tenant/', ARRAY['tenant']);
SELECT * FROM lease.fenced_tables() ORDER BY fenced_table;
SELECT acquired, epoch FROM lease.acquire('f/tenant/7', 'w', interval '1 min');
BEGIN;
SELECT lease.present('f/tenant/7', 'w', 1);
INSERT INTO f_tenants VALUES (7, 'mine');
COMMIT;
BEGIN;
SELECT lease.present('f/tenant/7', 'w', 1);
INSERT INTO f_tenants VALUES (8, 'not mine');
ROLLBACK;
INSERT INTO f_tenants VALUES (NULL, 'no key');
SELECT * FROM f_tenants;

-- Unfenced, the table takes writes again.
SELECT lease.unprotect_table('f_jobs');
SELECT lease.unprotect_table('f_jobs');
INSERT INTO f_jobs VALUES (3, 'unfenced');
SELECT count(*) FROM f_jobs;
SELECT lease.unprotect_table('f_tenants');
DROP TABLE f_jobs, f_tenants;

-- Only the table's owner may fence it, and a present names a valid token.
CREATE TABLE f_owned (v text);
CREATE ROLE lh_regress_writer;
GRANT lh_regress_writer TO current_user;
GRANT INSERT ON f_owned TO lh_regress_writer;
SET SESSION AUTHORIZATION lh_regress_writer;
SELECT lh_test.raised($$SELECT lease.protect_table('f_owned', 'f/owned')$$);
RESET SESSION AUTHORIZATION;
DROP TABLE f_owned;
DROP ROLE lh_regress_writer;
SELECT lease.present('', 'w', 1);
SELECT lease.present('f/jobs', 'w', 0);
