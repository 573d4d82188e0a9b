-- leasehold: the bookkeeping of leasehold::install, created before the
-- migrations run (src/install.rs): the versions it applied, readable by
-- nobody but its owner. Diesel's runner keeps its own table instead.
CREATE TABLE IF NOT EXISTS lease.schema_migrations (
    version      text        PRIMARY KEY,
    name         text        NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
REVOKE ALL ON TABLE lease.schema_migrations FROM PUBLIC;
