//! A realistic shared-database deployment for the security tests: a
//! database owned by a non-superuser role that installs leasehold, and
//! separate login roles acting as the application, a batch worker, an
//! operator and an attacker. None of them is a superuser; the operator gets
//! only what a test grants it.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

use crate::database::{apply_sql_patch, TestDb};
use crate::server::TestServer;

/// One database and five login roles (see the module documentation). The
/// roles are cluster-wide, so their names start with the database's name;
/// dropping the deployment drops the database and then the roles.
#[derive(Debug)]
pub struct Deployment {
    /// The database (leasehold installed by [`Deployment::owner`]).
    pub db: TestDb,
    /// Owns the database and installed leasehold; owns schema `lease`.
    pub owner: String,
    /// The application's role.
    pub app: String,
    /// A batch job's role, a second legitimate user.
    pub worker: String,
    /// The role tests grant operator actions to.
    pub operator: String,
    /// A role with nothing but CONNECT (as every role has by default):
    /// compromised or curious, it tries to break the others' guarantees.
    pub attacker: String,
}

impl Deployment {
    /// A fresh deployment with leasehold installed by the owner role (and
    /// `LEASEHOLD_TEST_SQL_PATCH` applied, see [`Deployment::new_on`]).
    // Not `Default`: it creates a database and roles.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Deployment {
        Deployment::new_on(TestServer::from_env())
    }

    /// A fresh deployment with leasehold installed, on `server` (the CLI's
    /// tests use [`TestServer::local`], never the server `DATABASE_URL`
    /// names). When `LEASEHOLD_TEST_SQL_PATCH` names a file, its SQL runs
    /// as the owner right after the install (see
    /// [`crate::database::apply_sql_patch`]; for the SQL mutation runner,
    /// test-support/mutation/README.md).
    pub fn new_on(server: &'static TestServer) -> Deployment {
        let deployment = Deployment::uninstalled_on(server);
        let mut owner = deployment.conn_as(&deployment.owner);
        leasehold::install(&mut owner)
            .unwrap_or_else(|error| panic!("install as the database owner: {error}"));
        apply_sql_patch(&mut owner);
        deployment
    }

    /// The same roles and database, leasehold not installed yet.
    pub fn uninstalled() -> Deployment {
        Deployment::uninstalled_on(TestServer::from_env())
    }

    /// [`Deployment::uninstalled`] on `server`.
    pub fn uninstalled_on(server: &'static TestServer) -> Deployment {
        let db = TestDb::empty_on(server);
        let role = |suffix: &str| format!("{}_{suffix}", db.name);
        let deployment = Deployment {
            owner: role("owner"),
            app: role("app"),
            worker: role("worker"),
            operator: role("operator"),
            attacker: role("attacker"),
            db,
        };
        let mut admin = deployment.admin();
        let mut sql = String::new();
        for role in deployment.roles() {
            sql.push_str(&format!("CREATE ROLE {role} LOGIN;\n"));
        }
        sql.push_str(&format!(
            "ALTER DATABASE {} OWNER TO {};",
            deployment.db.name, deployment.owner
        ));
        admin
            .batch_execute(&sql)
            .unwrap_or_else(|error| panic!("create the deployment's roles: {error}"));
        deployment
    }

    /// Every role of the deployment, owner first.
    pub fn roles(&self) -> [&str; 5] {
        [
            &self.owner,
            &self.app,
            &self.worker,
            &self.operator,
            &self.attacker,
        ]
    }

    /// A superuser connection to the database (setup and raw checks only).
    pub fn admin(&self) -> PgConnection {
        self.db.conn()
    }

    /// A connection to the database as `role`.
    pub fn conn_as(&self, role: &str) -> PgConnection {
        self.db.conn_as(role)
    }

    /// The URL of the database as `role`, for pools and the CLI.
    pub fn url_as(&self, role: &str) -> String {
        self.db.url.replacen("postgres@", &format!("{role}@"), 1)
    }

    /// Runs `sql` as the superuser (for example GRANTs to the operator).
    pub fn admin_exec(&self, sql: &str) {
        self.admin()
            .batch_execute(sql)
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        crate::coverage::record(self.db.server(), &self.db.name);
        // The database first: the roles own objects only in it, and a role
        // that owns objects cannot be dropped.
        let Ok(mut admin) = PgConnection::establish(&self.db.server().admin_url()) else {
            return;
        };
        let _ = admin.batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.db.name
        ));
        for role in self.roles() {
            let _ = admin.batch_execute(&format!("DROP ROLE IF EXISTS {role}"));
        }
    }
}
