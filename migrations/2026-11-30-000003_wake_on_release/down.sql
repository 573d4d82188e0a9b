-- Removes wake-on-release: the notification trigger and the waiter
-- registry. The lease functions were never redefined.
DROP TRIGGER IF EXISTS notify_released ON lease.leases;
DROP FUNCTION IF EXISTS lease._notify_released();
DROP FUNCTION IF EXISTS lease._waiter_reset();
DROP FUNCTION IF EXISTS lease._waiter_unwatch(text);
DROP FUNCTION IF EXISTS lease._waiter_watch(text);
DROP FUNCTION IF EXISTS lease._waiter_limit();
DROP FUNCTION IF EXISTS lease._waiter_lock_id(bytea);
DROP TABLE IF EXISTS lease.waiters;
