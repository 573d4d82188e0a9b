-- Removes the operator actions. Namespace rules already written stay in
-- lease.namespaces, and a raised generation in lease.lineage (migration
-- 2026-11-30-000001 owns both tables); both keep applying.
DROP FUNCTION IF EXISTS lease.raise_generation(bigint);
DROP FUNCTION IF EXISTS lease.force_release(text, bigint);
DROP FUNCTION IF EXISTS lease.force_release(text);
DROP FUNCTION IF EXISTS lease.list_namespaces();
DROP FUNCTION IF EXISTS lease.unbind_namespace(text);
DROP FUNCTION IF EXISTS lease.bind_namespace(text, text);
DROP FUNCTION IF EXISTS lease._dropped_role_label(oid);
DROP FUNCTION IF EXISTS lease._prefix_violations(text);
