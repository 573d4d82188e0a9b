//! Installing the SQL side: the migrations, then the files of functions
//! (src/sql_files.rs lists both), with leasehold's own harness rather than
//! diesel_migrations': versions live in `lease.schema_migrations` (never the
//! application's), it needs CREATE on the database only (not on `public`), and one
//! transaction under an advisory lock lets concurrent installers queue. It refuses
//! the extension install, PostgreSQL before 14, and a schema `lease` another role
//! owns or can put code into, whose code would run as the installer.
//! The functions step's version is the newest migration's plus a digest of the
//! files, so any function change is applied again. [`MIGRATIONS`] hands the same
//! steps to Diesel's runner.

use crate::error::Repr;
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

/// leasehold's SQL as a Diesel migration source, the steps [`install()`] applies.
/// Its functions step removes replaced and
/// retired versions from Diesel's table, so `revert_all_migrations` keeps working.
#[derive(Debug, Clone, Copy, Default)]
pub struct Migrations {
    _private: (),
}

/// The migrations and the functions step, for Diesel's runner.
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

/// Every step, in order; for Diesel's runner the functions step also tidies its bookkeeping.
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

/// Deletes from `table` the versions the files of functions at `current` replace.
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

/// What [`install()`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// Versions applied by this call, oldest first.
    pub applied: Vec<String>,
}

#[derive(QueryableByName)]
struct VersionRow {
    #[diesel(sql_type = Text)]
    version: String,
}

/// Installs or upgrades leasehold in the connected database. Idempotent and safe
/// from several processes at once; commits, so not inside a transaction of yours.
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
                LeaseError::install_blocked_or(source, |source| {
                    LeaseError::from(Repr::Migration {
                        version: step.version.clone(),
                        source,
                    })
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

/// Removes everything [`install()`] created, all lease state and epochs included:
/// a later install restarts every key at epoch 1, voiding fencing. For tests.
pub fn uninstall(conn: &mut PgConnection) -> Result<(), LeaseError> {
    let steps = steps(false);
    conn.transaction(|conn| {
        lock_and_prepare(conn)?;
        let done = recorded_versions(conn)?;
        diesel::sql_query(install::DROP_BOOKKEEPING).execute(conn)?;
        // The functions first, whichever version of them is installed.
        conn.batch_execute(sql_files::DROP_FUNCTIONS)
            .map_err(|source| {
                LeaseError::from(Repr::Migration {
                    version: sql_files::functions_version(),
                    source: Box::new(source),
                })
            })?;
        for step in steps.iter().rev() {
            if !done.contains(&step.version) || sql_files::is_functions_version(&step.version) {
                continue;
            }
            step.revert(conn).map_err(|source| {
                LeaseError::from(Repr::Migration {
                    version: step.version.clone(),
                    source,
                })
            })?;
        }
        diesel::sql_query(install::DROP_SCHEMA).execute(conn)?;
        Ok(())
    })
}

/// Whether leasehold's functions exist (however installed); any role may ask.
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

/// A check statement the embedded SQL must hold (`what` says which).
fn embedded(check: Option<&'static str>, what: &str) -> Result<&'static str, LeaseError> {
    check.ok_or_else(|| {
        LeaseError::from(Repr::EmbeddedSql {
            reason: format!("the embedded SQL has no {what} check"),
        })
    })
}

fn lock_and_prepare(conn: &mut PgConnection) -> Result<(), LeaseError> {
    // Before anything is created: an unsupported server gets nothing.
    conn.batch_execute(embedded(install::version_check(), "server version")?)
        .map_err(LeaseError::from_install_diesel)?;
    // Every lock the install waits for, from here on, within the bound.
    conn.batch_execute(install::SET_LOCK_TIMEOUT)
        .map_err(LeaseError::from_install_diesel)?;
    diesel::sql_query(install::LOCK)
        .bind::<diesel::sql_types::BigInt, _>(INSTALL_LOCK_KEY)
        .execute(conn)
        .map_err(LeaseError::from_install_diesel)?;
    // Never take over an extension install: the extension owns its objects.
    if let Some(row) = diesel::sql_query(install::EXTENSION_VERSION)
        .load::<VersionRow>(conn)?
        .into_iter()
        .next()
    {
        return Err(LeaseError::from(Repr::ExtensionInstalled {
            version: row.version,
        }));
    }
    // Ownership first: a schema owned by someone else is never written to.
    let permitted = install::install_check(crate::sql::names::INSTALL_NOT_PERMITTED);
    conn.batch_execute(embedded(permitted, "create-permitted")?)
        .map_err(LeaseError::from_install_diesel)?;
    conn.batch_execute(install::CREATE_SCHEMA)
        .map_err(LeaseError::from_install_diesel)?;
    conn.batch_execute(embedded(install::schema_owner_check(), "schema-ownership")?)
        .map_err(LeaseError::from_install_diesel)?;
    let private = install::install_check(crate::sql::names::SCHEMA_NOT_PRIVATE);
    conn.batch_execute(embedded(private, "schema-privacy")?)
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
    /// `install`'s ownership check is migration 1's `lease_schema_not_owned` statement.
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

    /// Migration 1 opens with the version check, so Diesel's runner refuses an old server too.
    #[test]
    fn the_version_check_is_the_first_statement_of_migration_1() {
        let up = crate::sql_files::MIGRATION_SQL[0].1;
        let check = format!(
            "{};",
            crate::sql::install::version_check().expect("a check")
        );
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

    /// The SQL's threshold and its DETAIL name the same minimum version.
    #[test]
    fn the_version_check_refuses_exactly_the_majors_below_14() {
        use crate::sql::install::{version_check, MINIMUM_MAJOR};
        let version_check = version_check().expect("migration 1's version check");
        assert_eq!(MINIMUM_MAJOR, 14);
        let threshold = MINIMUM_MAJOR * 10000;
        assert!(version_check.contains(&format!("OPERATOR(pg_catalog.<) {threshold} THEN")));
        assert!(version_check.contains(&format!("'minimum={MINIMUM_MAJOR} server_version='")));
        assert!(version_check.contains(&format!("PostgreSQL {MINIMUM_MAJOR} or newer")));
        // server_version_num is major * 10000 + minor since PostgreSQL 10.
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
