//! Installing the migrations, then the files of functions, with leasehold's own
//! harness: versions in `lease.schema_migrations` (never the application's), CREATE
//! on the database is enough, and one transaction under an advisory lock lets
//! installers queue. [`MIGRATIONS`] hands the same steps to Diesel's runner.

use std::fmt;

use diesel::connection::{BoxableConnection, SimpleConnection};
use diesel::dsl;
use diesel::migration::{self, Migration, MigrationMetadata, MigrationName, MigrationSource};
use diesel::pg::{Pg, PgConnection};
use diesel::prelude::*;
use diesel::sql_types::{Bool, Text};

use crate::error::{LeaseError, Repr};
use crate::sql::{install as sql, names};
use crate::sql_files;

/// leasehold's SQL as a Diesel migration source, the steps [`install()`] applies.
/// Its functions step forgets the functions steps it replaces, so
/// `revert_all_migrations` finds every recorded version in the source.
#[derive(Debug, Clone, Copy, Default)]
pub struct Migrations {
    _private: (),
}

/// The migrations and the functions step, for Diesel's runner.
pub const MIGRATIONS: Migrations = Migrations { _private: () };

impl MigrationSource<Pg> for Migrations {
    fn migrations(&self) -> migration::Result<Vec<Box<dyn Migration<Pg>>>> {
        let steps = steps("__diesel_schema_migrations").into_iter();
        Ok(steps.map(|step| Box::new(step) as _).collect())
    }
}

/// One step: a migration, or the files of functions.
struct Step {
    name: String,
    version: String,
    up: String,
    down: &'static str,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl MigrationName for Step {
    fn version(&self) -> migration::MigrationVersion<'_> {
        self.version.as_str().into()
    }
}

impl MigrationMetadata for Step {}

impl Migration<Pg> for Step {
    fn run(&self, conn: &mut dyn BoxableConnection<Pg>) -> migration::Result<()> {
        Ok(conn.batch_execute(&self.up)?)
    }

    fn revert(&self, conn: &mut dyn BoxableConnection<Pg>) -> migration::Result<()> {
        Ok(conn.batch_execute(self.down)?)
    }

    fn metadata(&self) -> &dyn MigrationMetadata {
        self
    }

    fn name(&self) -> &dyn MigrationName {
        self
    }
}

impl Step {
    /// A failure of this step's SQL, naming its version.
    fn failed(&self, source: Box<dyn std::error::Error + Send + Sync>) -> LeaseError {
        let version = self.version.clone();
        LeaseError::from(Repr::Migration { version, source })
    }
}

/// Every step, in order: the migrations, then the files of functions, which
/// also forget, in the bookkeeping `table`, the functions steps they replace.
fn steps(table: &str) -> Vec<Step> {
    let version = sql_files::functions_version();
    let forget = sql::forget_replaced_functions(table, &version);
    let functions = Step {
        name: format!("{version}_functions"),
        up: format!("{}\n{forget};\n", sql_files::functions_sql()),
        version,
        down: sql_files::DROP_FUNCTIONS,
    };
    let migrations = sql_files::MIGRATION_SQL.iter().map(|(dir, up, down)| Step {
        name: (*dir).to_owned(),
        version: sql_files::version_of(dir),
        up: (*up).to_owned(),
        down,
    });
    migrations.chain([functions]).collect()
}

/// What [`install()`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// Versions applied by this call, oldest first.
    pub applied: Vec<String>,
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
    let steps = steps("lease.schema_migrations");
    conn.transaction(|conn| {
        lock_and_prepare(conn)?;
        let done = recorded_versions(conn)?;
        let mut applied = Vec::new();
        for step in steps.iter().filter(|step| !done.contains(&step.version)) {
            step.run(conn)
                .map_err(|source| LeaseError::install_blocked_or(source, |s| step.failed(s)))?;
            diesel::sql_query(sql::RECORD_VERSION)
                .bind::<Text, _>(&step.version)
                .bind::<Text, _>(&step.name)
                .execute(conn)?;
            applied.push(step.version.clone());
        }
        Ok(InstallReport { applied })
    })
}

/// Removes everything [`install()`] created, all lease state and epochs included:
/// a later install restarts every key at epoch 1, voiding fencing. For tests.
pub fn uninstall(conn: &mut PgConnection) -> Result<(), LeaseError> {
    let steps = steps("lease.schema_migrations");
    conn.transaction(|conn| {
        lock_and_prepare(conn)?;
        let done = recorded_versions(conn)?;
        conn.batch_execute(sql::DROP_BOOKKEEPING)?;
        // The functions first, whichever version of them is installed.
        for (i, step) in steps.iter().rev().enumerate() {
            if i == 0 || done.contains(&step.version) {
                step.revert(conn).map_err(|s| step.failed(s))?;
            }
        }
        Ok(conn.batch_execute(sql::DROP_SCHEMA)?)
    })
}

/// Whether leasehold's functions exist (however installed); any role may ask.
pub fn is_installed(conn: &mut PgConnection) -> Result<bool, LeaseError> {
    Ok(dsl::sql::<Bool>(sql::INSTALLED).get_result(conn)?)
}

/// Versions recorded as installed, oldest first; empty when not installed.
pub fn installed_versions(conn: &mut PgConnection) -> Result<Vec<String>, LeaseError> {
    if !dsl::sql::<Bool>(sql::BOOKKEEPING_PRESENT).get_result(conn)? {
        return Ok(Vec::new());
    }
    recorded_versions(conn)
}

/// The statement of `sql` that raises `constraint`: a check written once in SQL.
fn check(sql: &'static str, constraint: &str) -> Result<&'static str, LeaseError> {
    sql_files::check(sql, constraint).ok_or_else(|| {
        let reason = format!("the embedded SQL has no {constraint} check");
        Repr::EmbeddedSql { reason }.into()
    })
}

/// Runs the installer's checks, takes its lock and creates its bookkeeping.
fn lock_and_prepare(conn: &mut PgConnection) -> Result<(), LeaseError> {
    // Never take over an extension install: the extension owns its objects.
    let extension = dsl::sql::<Text>(sql::EXTENSION_VERSION).load::<String>(conn)?;
    if let Some(version) = extension.into_iter().next() {
        return Err(Repr::ExtensionInstalled { version }.into());
    }
    let (migration_1, checks) = (sql_files::MIGRATION_1, sql_files::INSTALL_CHECKS);
    // The server first: an unsupported one gets nothing. Then every lock the
    // install waits for is within the bound, and the schema's owner is
    // judged before anything is written into it.
    for statement in [
        check(migration_1, names::UNSUPPORTED_VERSION)?,
        sql::SET_LOCK_TIMEOUT,
        sql::LOCK,
        check(checks, names::INSTALL_NOT_PERMITTED)?,
        sql::CREATE_SCHEMA,
        check(migration_1, names::SCHEMA_NOT_OWNED)?,
        check(checks, names::SCHEMA_NOT_PRIVATE)?,
        sql_files::BOOKKEEPING,
    ] {
        conn.batch_execute(statement)
            .map_err(LeaseError::from_install_diesel)?;
    }
    Ok(())
}

/// The recorded versions, oldest first.
fn recorded_versions(conn: &mut PgConnection) -> Result<Vec<String>, LeaseError> {
    let mut versions: Vec<String> = dsl::sql::<Text>(sql::RECORDED_VERSIONS).load(conn)?;
    versions.sort();
    Ok(versions)
}
