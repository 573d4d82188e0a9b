//! Install paths compared: the catalog a leasehold install leaves (what
//! every path must leave alike) and the lease state an upgrade must keep.

use diesel::PgConnection;

/// The catalog of schema `lease` that every install path must leave alike,
/// one line per object: each function (signature, result, language,
/// volatility, strictness, SECURITY DEFINER, settings such as its
/// search_path, body and owner), each function's privileges (grantee,
/// privilege, grantor, grantable; order-independent), each table, view,
/// index and sequence with its owner and privileges, columns, constraints,
/// non-internal triggers (the extension's own lineage-restore trigger and
/// its function left out) and domains. leasehold's own bookkeeping table
/// `lease.schema_migrations` (an install by `install()` only) is left out.
pub fn catalog(conn: &mut PgConnection) -> Vec<String> {
    crate::query_lines(
        conn,
        "SELECT format('function %s returns %s language %s volatile=%s strict=%s definer=%s config=%s owner=%s body=%s',
                       p.oid::regprocedure, pg_get_function_result(p.oid), l.lanname, p.provolatile,
                       p.proisstrict, p.prosecdef, p.proconfig, pg_get_userbyid(p.proowner),
                       md5(coalesce(p.prosrc, '') || coalesce(pg_get_function_sqlbody(p.oid), ''))) AS line
           FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
          WHERE p.pronamespace = 'lease'::regnamespace AND p.proname <> '_lineage_restore'
         UNION ALL
         SELECT format('function acl %s %s %s by %s grantable=%s', p.oid::regprocedure,
                       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee)::text END,
                       a.privilege_type, pg_get_userbyid(a.grantor), a.is_grantable)
           FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
          WHERE p.pronamespace = 'lease'::regnamespace AND p.proname <> '_lineage_restore'
         UNION ALL
         SELECT format('relation %s kind %s owner %s', c.relname, c.relkind, pg_get_userbyid(c.relowner))
           FROM pg_class c
          WHERE c.relnamespace = 'lease'::regnamespace AND c.relname NOT LIKE 'schema_migrations%'
         UNION ALL
         SELECT format('relation acl %s %s %s by %s grantable=%s', c.relname,
                       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee)::text END,
                       a.privilege_type, pg_get_userbyid(a.grantor), a.is_grantable)
           FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
          WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind IN ('r', 'v', 'S')
            AND c.relname NOT LIKE 'schema_migrations%'
         UNION ALL
         SELECT format('column %s.%s %s notnull=%s default=%s', c.relname, a.attname,
                       format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid))
           FROM pg_class c
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
           LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
          WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind IN ('r', 'v')
            AND c.relname <> 'schema_migrations'
         UNION ALL
         SELECT format('index %s', pg_get_indexdef(i.indexrelid))
           FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
          WHERE c.relnamespace = 'lease'::regnamespace AND c.relname <> 'schema_migrations'
         UNION ALL
         SELECT format('constraint %s %s', co.conname, pg_get_constraintdef(co.oid))
           FROM pg_constraint co
          WHERE co.connamespace = 'lease'::regnamespace AND co.conname NOT LIKE 'schema_migrations%'
         UNION ALL
         SELECT format('trigger %s', pg_get_triggerdef(t.oid))
           FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          WHERE c.relnamespace = 'lease'::regnamespace AND NOT t.tgisinternal
            AND t.tgname <> 'lineage_restore'
         UNION ALL
         SELECT format('type %s %s owner %s', t.oid::regtype, t.typtype, pg_get_userbyid(t.typowner))
           FROM pg_type t
          WHERE t.typnamespace = 'lease'::regnamespace AND t.typtype = 'd'
         UNION ALL
         SELECT format('schema lease owner %s acl %s', pg_get_userbyid(n.nspowner), n.nspacl)
           FROM pg_namespace n WHERE n.nspname = 'lease'
         ORDER BY 1",
    )
}

/// The lease state an upgrade must keep: every lease row (key, owner,
/// epoch, expiry), heartbeat group, guard record, namespace rule and the
/// lineage row.
pub fn lease_state(conn: &mut PgConnection) -> Vec<String> {
    crate::query_lines(
        conn,
        "SELECT format('lease %s %s %s %s %s %s', key, owner, epoch, expires_at, lapsed_owner, group_id) AS line FROM lease.leases
         UNION ALL SELECT format('group %s %s %s %s', id, owner, expires_at, members) FROM lease.groups
         UNION ALL SELECT format('guard %s %s %s %s', resource, lease_key, accepted_epoch, updated_at) FROM lease.guards
         UNION ALL SELECT format('namespace %s %s', prefix, created_at) FROM lease.namespaces
         UNION ALL SELECT format('lineage %s %s %s %s %s', system_identifier, base, last_timeline, external_floor, pruned_through) FROM lease.lineage
         ORDER BY 1",
    )
}
