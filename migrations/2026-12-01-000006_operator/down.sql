-- Removes the functions of operator (up.sql), newest first.
DROP FUNCTION IF EXISTS lease.raise_generation(bigint);
DROP FUNCTION IF EXISTS lease.force_release(text, bigint);
DROP FUNCTION IF EXISTS lease.force_release(text);
DROP FUNCTION IF EXISTS lease._force_free(bytea, bigint);
DROP FUNCTION IF EXISTS lease.list_namespaces();
DROP FUNCTION IF EXISTS lease.unbind_namespace(text);
DROP FUNCTION IF EXISTS lease.bind_namespace(text, text);
DROP FUNCTION IF EXISTS lease._namespaces_changed();
DROP FUNCTION IF EXISTS lease._dropped_role_label(lease.namespaces);
DROP FUNCTION IF EXISTS lease._prefix_violations(text);
