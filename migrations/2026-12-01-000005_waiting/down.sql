-- Removes the functions of waiting (up.sql), newest first.
DROP FUNCTION IF EXISTS lease._waiter_reset();
DROP FUNCTION IF EXISTS lease._waiter_unwatch(text);
DROP FUNCTION IF EXISTS lease._waiter_watch(text);
