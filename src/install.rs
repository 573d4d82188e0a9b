//! Installing the SQL side: the migrations in `migrations/` (tables,
//! indexes, types, data), then the files of functions in `sql/functions/`
//! (src/sql_files.rs lists both).
//!
//! Why not diesel_migrations' own harness? It records versions in an
//! unqualified `__diesel_schema_migrations` found on the caller's
//! `search_path` (so it shares, and can collide with, the application's own
//! migration bookkeeping), needs CREATE on that schema (which PostgreSQL 15
//! no longer grants on `public`), and takes no lock across a run (two
//! processes starting at once race). [`install`] runs the same steps with
//! its own small harness instead:
//!
//! - versions are recorded in `lease.schema_migrations`, inside leasehold's
//!   own schema, so they never meet the application's versions;
//! - the whole install is one transaction holding a transaction-level
//!   advisory lock, so concurrent installers queue, the first installs and
//!   the rest find everything done; a failure leaves nothing behind;
//! - it needs only CREATE on the database (for schema `lease`);
//! - it refuses a database where leasehold is installed as the extension
//!   `leasehold` ([`LeaseError::ExtensionInstalled`]; the command
//!   `leasehold extension generate` writes the extension's files);
//! - it refuses a server older than PostgreSQL 14
//!   ([`LeaseError::UnsupportedVersion`]) before creating anything;
//! - it never adopts a schema `lease` another role owns
//!   ([`LeaseError::SchemaNotOwned`]): that role could replace leasehold's
//!   functions and run code as the installer;
//! - nor one that another role can put code into, by an object of its own
//!   there, CREATE on the schema or TRIGGER on a table
//!   ([`LeaseError::SchemaNotPrivate`]): the migrations would run that
//!   code as the installer, a superuser included.
//!
//! Versions: each migration directory is `YYYY-MM-DD-NNNNNN_<what>`; its
//! version is the digits. A table change after a release is a new
//! directory with a later version; released migrations are never edited.
//! The files of functions are one more step whose version is the newest
//! migration's, a dot and a digest of their text
//! ([`crate::sql_files::functions_version`]): a change to any function
//! changes it, and [`install`] applies the files again (they are written
//! `CREATE OR REPLACE`). [`install`] applies exactly the steps not yet
//! recorded, in order, and forgets the functions versions it replaced.
//!
//! [`MIGRATIONS`] hands the same steps to Diesel's runner, for applications
//! that run their migrations with `run_pending_migrations`.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use diesel::connection::{BoxableConnection, SimpleConnection};
use diesel::migration::{
    Migration, MigrationMetadata, MigrationName, MigrationSource, MigrationVersion,
};
use diesel::pg::{Pg, PgConnection};
use diesel::prelude::*;
use diesel::sql_types::Text;

use crate::error::LeaseError;
use crate::sql::install;
use crate::sql_files;

/// leasehold's SQL as a Diesel migration source: the migrations under
/// `migrations/`, oldest first, then one step that applies the files of
/// functions under `sql/functions/` (version: the newest migration's, a dot
/// and a digest of the files, so it is pending again whenever a function
/// changes). The steps [`install`] applies, for applications that run
/// `run_pending_migrations(leasehold::admin::MIGRATIONS)` themselves (see
/// docs/guide/getting-started.md, "Running the migrations with Diesel").
///
/// Diesel records the versions in its own `__diesel_schema_migrations`.
/// When the functions step runs, it removes from that table the versions
/// of leasehold's earlier functions steps and of the retired migrations
/// 000002 to 000008 (none of them is in this source any more), so that
/// `revert_all_migrations` keeps working after an upgrade.
#[derive(Debug, Clone, Copy, Default)]
pub struct Migrations {
    _private: (),
}

/// The migrations and the functions step, for Diesel's runner: see
/// [`Migrations`].
pub const MIGRATIONS: Migrations = Migrations { _private: () };

impl MigrationSource<Pg> for Migrations {
    fn migrations(&self) -> diesel::migration::Result<Vec<Box<dyn Migration<Pg>>>> {
        Ok(steps(true)
            .into_iter()
            .map(|step| Box::new(step) as Box<dyn Migration<Pg>>)
            .collect())
    }
}

/// One step: a migration, or the files of functions.
struct Step {
    name: String,
    version: String,
    up: Cow<'static, str>,
    down: &'static str,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl MigrationName for Step {
    fn version(&self) -> MigrationVersion<'_> {
        MigrationVersion::from(self.version.as_str())
    }
}

impl MigrationMetadata for Step {}

impl Migration<Pg> for Step {
    fn run(&self, conn: &mut dyn BoxableConnection<Pg>) -> diesel::migration::Result<()> {
        Ok(conn.batch_execute(&self.up)?)
    }

    fn revert(&self, conn: &mut dyn BoxableConnection<Pg>) -> diesel::migration::Result<()> {
        Ok(conn.batch_execute(self.down)?)
    }

    fn metadata(&self) -> &dyn MigrationMetadata {
        self
    }

    fn name(&self) -> &dyn MigrationName {
        self
    }
}

/// Every step, in order. For Diesel's runner (`for_diesel`), the functions
/// step also tidies Diesel's bookkeeping (see [`Migrations`]).
fn steps(for_diesel: bool) -> Vec<Step> {
    let mut steps: Vec<Step> = sql_files::MIGRATION_SQL
        .iter()
        .map(|(dir, up, down)| Step {
            name: (*dir).to_owned(),
            version: sql_files::version_of(dir),
            up: Cow::Borrowed(up),
            down,
        })
        .collect();
    let version = sql_files::functions_version();
    let mut up = sql_files::functions_sql();
    if for_diesel {
        up.push_str(&forget_replaced_versions(
            "__diesel_schema_migrations",
            &version,
        ));
    }
    steps.push(Step {
        name: format!("{version}_functions"),
        version,
        up: Cow::Owned(up),
        down: sql_files::DROP_FUNCTIONS,
    });
    steps
}

/// Deletes from a bookkeeping `table` the versions of earlier functions
/// steps and the retired migrations: the files of functions at `current`
/// replace everything they installed.
fn forget_replaced_versions(table: &str, current: &str) -> String {
    let retired: Vec<String> = sql_files::RETIRED_VERSIONS
        .iter()
        .map(|v| format!("'{v}'"))
        .collect();
    format!(
        "\nDELETE FROM {table} WHERE version IN ({}) OR (version ~ '^[0-9]{{14}}[.][0-9a-f]{{12}}$' AND version <> '{current}');\n",
        retired.join(", ")
    )
}

/// Advisory-lock key that serialises installers ("leasehld" in ASCII).
const INSTALL_LOCK_KEY: i64 = 0x6c65_6173_6568_6c64;

/// What [`install`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// Versions applied by this call, oldest first; empty when everything was
    /// already installed.
    pub applied: Vec<String>,
}

#[derive(QueryableByName)]
struct VersionRow {
    #[diesel(sql_type = Text)]
    version: String,
}

/// Installs (or upgrades) the lease functions in the connected database.
///
/// Idempotent and safe to call from several processes at once. Must not be
/// called inside an open transaction of the caller's (it commits).
///
/// ```no_run
/// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::error::LeaseError> {
/// let report = leasehold::install(conn)?;
/// println!("applied {:?}", report.applied);
/// # Ok(()) }
/// ```
pub fn install(conn: &mut PgConnection) -> Result<InstallReport, LeaseError> {
    let steps = steps(false);
    conn.transaction(|conn| {
        lock_and_prepare(conn)?;
        let done = recorded_versions(conn)?;
        let mut applied = Vec::new();
        for step in &steps {
            if done.contains(&step.version) {
                continue;
            }
            step.run(conn).map_err(|source| {
                LeaseError::install_blocked_or(source, |source| LeaseError::Migration {
                    version: step.version.clone(),
                    source,
                })
            })?;
            diesel::sql_query(install::RECORD_VERSION)
                .bind::<Text, _>(&step.version)
                .bind::<Text, _>(&step.name)
                .execute(conn)?;
            applied.push(step.version.clone());
        }
        if !applied.is_empty() {
            conn.batch_execute(&forget_replaced_versions(
                "lease.schema_migrations",
                &sql_files::functions_version(),
            ))?;
        }
        Ok(InstallReport { applied })
    })
}

/// Removes everything [`install`] created, including all lease state and
/// fencing epochs: a later install starts every key again at epoch 1, which
/// voids fencing for anything that recorded older epochs. Meant for tests and
/// for decommissioning.
pub fn uninstall(conn: &mut PgConnection) -> Result<(), LeaseError> {
    let steps = steps(false);
    conn.transaction(|conn| {
        lock_and_prepare(conn)?;
        let done = recorded_versions(conn)?;
        diesel::sql_query(install::DROP_BOOKKEEPING).execute(conn)?;
        // The functions first, whichever version of them is installed.
        conn.batch_execute(sql_files::DROP_FUNCTIONS)
            .map_err(|source| LeaseError::Migration {
                version: sql_files::functions_version(),
                source: Box::new(source),
            })?;
        for step in steps.iter().rev() {
            if !done.contains(&step.version) || sql_files::is_functions_version(&step.version) {
                continue;
            }
            step.revert(conn).map_err(|source| LeaseError::Migration {
                version: step.version.clone(),
                source,
            })?;
        }
        diesel::sql_query(install::DROP_SCHEMA).execute(conn)?;
        Ok(())
    })
}

/// Whether leasehold is installed in the connected database, by
/// [`install`], by Diesel's runner with [`MIGRATIONS`] or as the extension `leasehold`:
/// whether its functions exist, which any role may ask. Reads the catalog
/// only; for a command that should say "not installed" before it calls
/// anything.
pub fn is_installed(conn: &mut PgConnection) -> Result<bool, LeaseError> {
    let present: Present = diesel::sql_query(install::INSTALLED).get_result(conn)?;
    Ok(present.present)
}

#[derive(QueryableByName)]
struct Present {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    present: bool,
}

/// Versions recorded as installed, oldest first; empty when not installed.
pub fn installed_versions(conn: &mut PgConnection) -> Result<Vec<String>, LeaseError> {
    let present: Present = diesel::sql_query(install::BOOKKEEPING_PRESENT).get_result(conn)?;
    if !present.present {
        return Ok(Vec::new());
    }
    let mut versions: Vec<String> = diesel::sql_query(install::RECORDED_VERSIONS)
        .load::<VersionRow>(conn)?
        .into_iter()
        .map(|row| row.version)
        .collect();
    versions.sort();
    Ok(versions)
}

fn lock_and_prepare(conn: &mut PgConnection) -> Result<(), LeaseError> {
    // Before anything is created: an unsupported server gets nothing.
    conn.batch_execute(install::VERSION_CHECK)
        .map_err(LeaseError::from_install_diesel)?;
    // Every lock the install waits for, from here on, within the bound.
    conn.batch_execute(install::SET_LOCK_TIMEOUT)
        .map_err(LeaseError::from_install_diesel)?;
    diesel::sql_query(install::LOCK)
        .bind::<diesel::sql_types::BigInt, _>(INSTALL_LOCK_KEY)
        .execute(conn)
        .map_err(LeaseError::from_install_diesel)?;
    // An extension install is never taken over (nor removed) by the
    // migrations: the extension owns its objects, and its scripts refuse a
    // migrations install in turn.
    if let Some(row) = diesel::sql_query(install::EXTENSION_VERSION)
        .load::<VersionRow>(conn)?
        .into_iter()
        .next()
    {
        return Err(LeaseError::ExtensionInstalled {
            version: row.version,
        });
    }
    // The ownership check comes before the bookkeeping table: a schema
    // owned by someone else is never written to.
    conn.batch_execute(install::CREATE_PERMITTED_CHECK)
        .map_err(LeaseError::from_install_diesel)?;
    conn.batch_execute(install::CREATE_SCHEMA)
        .map_err(LeaseError::from_install_diesel)?;
    let owner_check = install::schema_owner_check().ok_or_else(|| LeaseError::EmbeddedSql {
        reason: "migration 1 has no schema-ownership check".to_owned(),
    })?;
    conn.batch_execute(owner_check)
        .map_err(LeaseError::from_install_diesel)?;
    conn.batch_execute(install::SCHEMA_PRIVATE_CHECK)
        .map_err(LeaseError::from_install_diesel)?;
    conn.batch_execute(install::CREATE_BOOKKEEPING)?;
    Ok(())
}

fn recorded_versions(conn: &mut PgConnection) -> Result<HashSet<String>, LeaseError> {
    Ok(diesel::sql_query(install::RECORDED_VERSIONS)
        .load::<VersionRow>(conn)?
        .into_iter()
        .map(|row| row.version)
        .collect())
}

#[cfg(test)]
mod tests {
    /// The ownership check `install` runs is migration 1's statement that
    /// raises `lease_schema_not_owned`, comparing the schema's owner with
    /// the installing role.
    #[test]
    fn the_schema_owner_check_is_taken_from_migration_1() {
        let check = crate::sql::install::schema_owner_check().expect("migration 1 has it");
        assert!(check.starts_with("DO $$"), "{check}");
        assert!(check.contains("ERRCODE = '42501'"), "{check}");
        assert!(
            check.contains("n.nspowner OPERATOR(pg_catalog.<>)"),
            "{check}"
        );
        assert!(
            check.contains("r.rolname OPERATOR(pg_catalog.=) current_user"),
            "{check}"
        );
        let up = crate::sql_files::MIGRATION_SQL[0].1;
        assert!(up.contains(&format!("{check};")));
    }

    /// Migration 1 opens with the version check `install` runs first (after
    /// only its own lock_timeout), so Diesel's runner refuses an old
    /// server too.
    #[test]
    fn the_version_check_is_the_first_statement_of_migration_1() {
        let up = crate::sql_files::MIGRATION_SQL[0].1;
        let check = format!("{};", crate::sql::install::VERSION_CHECK);
        let at = up.find(&check).expect("migration 1 runs the version check");
        let before: String = up[..at]
            .lines()
            .filter(|line| !line.trim_start().starts_with("--"))
            .filter(|line| line.trim() != "SET LOCAL lock_timeout = '5s';")
            .collect();
        assert!(
            before.trim().is_empty(),
            "statements before the check: {before}"
        );
    }

    /// The SQL compares `server_version_num` with the minimum major version
    /// times 10000, and names the same minimum in its DETAIL.
    #[test]
    fn the_version_check_refuses_exactly_the_majors_below_14() {
        use crate::sql::install::{MINIMUM_MAJOR, VERSION_CHECK};
        assert_eq!(MINIMUM_MAJOR, 14);
        let threshold = MINIMUM_MAJOR * 10000;
        assert!(VERSION_CHECK.contains(&format!("OPERATOR(pg_catalog.<) {threshold} THEN")));
        assert!(VERSION_CHECK.contains(&format!("'minimum={MINIMUM_MAJOR} server_version='")));
        assert!(VERSION_CHECK.contains(&format!("PostgreSQL {MINIMUM_MAJOR} or newer")));
        // server_version_num is major * 10000 + minor since PostgreSQL 10,
        // and 90600-style before it.
        let refused = |num: u32| num < threshold;
        for (num, is_refused) in [
            (90624, true),
            (120022, true),
            (130011, true),
            (139999, true),
            (140000, false),
            (140023, false),
            (150018, false),
            (180004, false),
        ] {
            assert_eq!(refused(num), is_refused, "{num}");
        }
    }
}
