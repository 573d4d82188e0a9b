//! The checks of `leasehold doctor`, one function each, in the order they
//! are printed. Each returns its findings and never fails the command: a
//! query that cannot run becomes a finding that says so.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::migration::MigrationSource;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text, Timestamptz};
use diesel::PgConnection;

use leasehold::admin::BoundRole;

use super::{Finding, Options, Status};
use crate::connect;
use crate::duration;
use leasehold::admin::Operator;

/// The API functions an application role calls: "can this role act".
const ACT: [&str; 10] = [
    "acquire",
    "renew",
    "release",
    "inspect",
    "generation",
    "admit",
    "check_held",
    "admit_held",
    "renew_admit",
    "inspect_guard",
];

/// The operator actions, granted to nobody by default: "can this role
/// operate". (`prune`, when installed, is one too.)
const OPERATE: [&str; 7] = [
    "force_release",
    "fence",
    "bind_namespace",
    "unbind_namespace",
    "list_namespaces",
    "raise_generation",
    "prune",
];

/// How long the listener check waits for its own notification.
const NOTIFY_WAIT: Duration = Duration::from_secs(5);

/// A clock difference beyond this (plus the measurement's error bar) is a
/// warning.
const CLOCK_TOLERANCE: Duration = Duration::from_secs(1);

/// Every check, in order.
pub fn all(conn: &mut PgConnection, options: &Options) -> Vec<Finding> {
    let mut findings = vec![server(conn)];
    let installed = install(conn, &mut findings);
    if installed {
        findings.extend(privileges(conn));
        findings.push(namespaces(conn));
    }
    findings.push(synchronous_commit(conn));
    findings.push(standby(conn));
    findings.push(pooler(conn, options.url));
    findings.push(listener(conn, options.url));
    findings.push(clock(conn));
    if installed {
        findings.push(storage(conn, options.idle));
    }
    findings
}

fn failed_query(name: &'static str, what: &str, error: &diesel::result::Error) -> Finding {
    Finding::new(
        name,
        Status::Warn,
        format!("could not {what}: {error}"),
        "check the role's privileges and run doctor again",
    )
}

#[derive(QueryableByName)]
struct ServerRow {
    #[diesel(sql_type = Text)]
    version: String,
    #[diesel(sql_type = Text)]
    role: String,
    #[diesel(sql_type = Text)]
    database: String,
}

fn server(conn: &mut PgConnection) -> Finding {
    match diesel::sql_query(
        "SELECT current_setting('server_version') AS version, current_user::text AS role, \
                current_database()::text AS database",
    )
    .get_result::<ServerRow>(conn)
    {
        Ok(row) => Finding::new(
            "server",
            Status::Ok,
            format!(
                "PostgreSQL {}, database {:?}, role {:?}",
                row.version, row.database, row.role
            ),
            "nothing",
        ),
        Err(error) => failed_query("server", "read the server version", &error),
    }
}

#[derive(QueryableByName)]
struct InstallRow {
    #[diesel(sql_type = Nullable<Text>)]
    extension: Option<String>,
    #[diesel(sql_type = Bool)]
    functions: bool,
    #[diesel(sql_type = Bool)]
    bookkeeping: bool,
    #[diesel(sql_type = Bool)]
    diesel_table: bool,
}

#[derive(QueryableByName)]
struct VersionRow {
    #[diesel(sql_type = Text)]
    version: String,
}

/// The versions this binary embeds, oldest first.
fn embedded_versions() -> Vec<String> {
    let mut versions: Vec<String> =
        MigrationSource::<Pg>::migrations(&leasehold::admin::MIGRATIONS)
            .map(|migrations| {
                migrations
                    .iter()
                    .map(|migration| migration.name().version().to_string())
                    .collect()
            })
            .unwrap_or_default();
    versions.sort();
    versions
}

/// Which install path, which version, and what is pending: findings
/// `install` and `upgrades`. Returns whether the lease functions are there.
fn install(conn: &mut PgConnection, findings: &mut Vec<Finding>) -> bool {
    let row = match diesel::sql_query(
        "SELECT (SELECT e.extversion::text FROM pg_catalog.pg_extension AS e WHERE e.extname = 'leasehold') AS extension, \
                to_regprocedure('lease.inspect(text)') IS NOT NULL AS functions, \
                to_regclass('lease.schema_migrations') IS NOT NULL AS bookkeeping, \
                to_regclass('__diesel_schema_migrations') IS NOT NULL AS diesel_table",
    )
    .get_result::<InstallRow>(conn)
    {
        Ok(row) => row,
        Err(error) => {
            findings.push(failed_query("install", "look for leasehold", &error));
            return false;
        }
    };
    let embedded = embedded_versions();
    let latest = embedded.last().cloned().unwrap_or_default();
    if let Some(version) = row.extension {
        findings.push(Finding::new(
            "install",
            Status::Ok,
            format!("installed as the extension `leasehold`, version {version}"),
            "nothing",
        ));
        findings.push(upgrades_of_extension(&version, &latest));
        return true;
    }
    if !row.functions {
        findings.push(Finding::new(
            "install",
            Status::Fail,
            "leasehold is not installed in this database (no lease.inspect(text))",
            "run `leasehold install` with this --database-url (or CREATE EXTENSION leasehold after `leasehold extension generate`)",
        ));
        return false;
    }
    // The migrations path: `leasehold install` records versions in
    // lease.schema_migrations; vendored migrations run by diesel's own
    // harness record them in __diesel_schema_migrations.
    let (path, table) = if row.bookkeeping {
        (
            "installed by `leasehold install` (versions in lease.schema_migrations)",
            "lease.schema_migrations",
        )
    } else if row.diesel_table {
        (
            "installed from vendored migrations by diesel (versions in __diesel_schema_migrations)",
            "__diesel_schema_migrations",
        )
    } else {
        findings.push(Finding::new(
            "install",
            Status::Warn,
            "the lease functions are there, but no record of how they were installed (neither the extension, lease.schema_migrations nor __diesel_schema_migrations)",
            "reinstall the way you upgrade: `leasehold install` on a fresh schema, or the extension",
        ));
        return true;
    };
    findings.push(Finding::new("install", Status::Ok, path, "nothing"));
    let versions = diesel::sql_query(format!(
        "SELECT version::text AS version FROM {table} WHERE version = ANY ($1)"
    ))
    .bind::<Array<Text>, _>(&embedded)
    .load::<VersionRow>(conn);
    let applied: BTreeSet<String> = match versions {
        Ok(rows) => rows.into_iter().map(|row| row.version).collect(),
        Err(error) => {
            // Not being able to look is not a fault of the deployment.
            findings.push(Finding::new(
                "upgrades",
                Status::Ok,
                format!("not checked: this role may not read {table} ({error})"),
                "run doctor as the role that installed leasehold to see pending upgrades",
            ));
            return true;
        }
    };
    findings.push(upgrades_of_migrations(&applied, &embedded, table));
    true
}

fn upgrades_of_extension(version: &str, latest: &str) -> Finding {
    // Versions carry a digest of the functions' text, so they have no
    // order: this binary knows only its own.
    if version == latest {
        Finding::new(
            "upgrades",
            Status::Ok,
            format!("extension version {version} is the one this binary installs"),
            "nothing",
        )
    } else {
        Finding::new(
            "upgrades",
            Status::Warn,
            format!("extension version {version} is installed; this binary installs {latest}"),
            "if this binary is newer, copy the files of `leasehold extension generate` into the server's extension directory and run ALTER EXTENSION leasehold UPDATE; otherwise use the leasehold binary that installed it",
        )
    }
}

fn upgrades_of_migrations(applied: &BTreeSet<String>, embedded: &[String], table: &str) -> Finding {
    let pending: Vec<&String> = embedded.iter().filter(|v| !applied.contains(*v)).collect();
    if pending.is_empty() {
        Finding::new(
            "upgrades",
            Status::Ok,
            format!(
                "all {} migrations this binary embeds are applied",
                embedded.len()
            ),
            "nothing",
        )
    } else {
        let list: Vec<&str> = pending.iter().map(|v| v.as_str()).collect();
        Finding::new(
            "upgrades",
            Status::Warn,
            format!("pending migrations: {} (not in {table})", list.join(", ")),
            if table == "lease.schema_migrations" {
                "run `leasehold install` as the role that installed leasehold"
            } else {
                "copy the new migration directories into your migrations folder and run them (diesel migration run)"
            },
        )
    }
}

#[derive(QueryableByName)]
struct FunctionRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    signature: String,
    #[diesel(sql_type = Bool)]
    allowed: bool,
}

#[derive(QueryableByName)]
struct ListRow {
    #[diesel(sql_type = Bool)]
    allowed: bool,
    #[diesel(sql_type = Text)]
    role: String,
}

/// Can this role act (the API), operate (the operator actions), list (`ls`,
/// `watch`)? Findings `privilege.act`, `privilege.operate`,
/// `privilege.list`.
fn privileges(conn: &mut PgConnection) -> Vec<Finding> {
    let functions = match diesel::sql_query(
        "SELECT p.proname::text AS name, p.oid::regprocedure::text AS signature, \
                has_function_privilege(p.oid, 'EXECUTE') AS allowed \
           FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace \
          WHERE n.nspname = 'lease' ORDER BY 2",
    )
    .load::<FunctionRow>(conn)
    {
        Ok(rows) => rows,
        Err(error) => return vec![failed_query("privilege.act", "read the privileges", &error)],
    };
    let list = diesel::sql_query(
        "SELECT has_table_privilege('lease.leases', 'SELECT') \
                AND has_table_privilege('lease.groups', 'SELECT') AS allowed, \
                current_user::text AS role",
    )
    .get_result::<ListRow>(conn);
    let role = list
        .as_ref()
        .map(|row| row.role.clone())
        .unwrap_or_else(|_| "this role".to_owned());
    let of = |names: &[&str], allowed: bool| -> Vec<String> {
        functions
            .iter()
            .filter(|f| names.contains(&f.name.as_str()) && f.allowed == allowed)
            .map(|f| f.signature.clone())
            .collect()
    };
    let mut findings = Vec::new();
    let act_denied = of(&ACT, false);
    findings.push(if act_denied.is_empty() {
        Finding::new(
            "privilege.act",
            Status::Ok,
            format!("{role} may run every lease and guard function (namespace rules may still bind key prefixes to other roles: `leasehold namespace ls`)"),
            "nothing",
        )
    } else {
        Finding::new(
            "privilege.act",
            Status::Fail,
            format!("{role} may not run {}", act_denied.join(", ")),
            format!(
                "as the role that installed leasehold: GRANT EXECUTE ON FUNCTION {} TO {role}",
                act_denied.join(", ")
            ),
        )
    });
    let operate_granted = of(&OPERATE, true);
    let operate_denied = of(&OPERATE, false);
    findings.push(match (operate_granted.is_empty(), operate_denied.is_empty()) {
        (_, true) => Finding::new(
            "privilege.operate",
            Status::Ok,
            format!("{role} may run every operator action"),
            "nothing",
        ),
        (true, false) => Finding::new(
            "privilege.operate",
            Status::Ok,
            format!("{role} may run no operator action (right for an application role; they are granted to nobody by default)"),
            format!("to make it an operator: GRANT EXECUTE ON FUNCTION {} TO {role}", operate_denied.join(", ")),
        ),
        (false, false) => Finding::new(
            "privilege.operate",
            Status::Warn,
            format!(
                "{role} may run {} but not {}",
                operate_granted.join(", "),
                operate_denied.join(", ")
            ),
            format!(
                "grant the rest if it operates (GRANT EXECUTE ON FUNCTION {} TO {role}), or revoke what it should not run",
                operate_denied.join(", ")
            ),
        ),
    });
    findings.push(match list {
        Ok(ListRow { allowed: true, .. }) => Finding::new(
            "privilege.list",
            Status::Ok,
            format!("{role} may list keys (`leasehold ls`, `watch`)"),
            "nothing",
        ),
        Ok(ListRow { allowed: false, .. }) => Finding::new(
            "privilege.list",
            Status::Ok,
            format!("{role} may not list keys: ls and watch read lease.leases and lease.groups, closed to callers by design; `leasehold inspect KEY` works"),
            "to list, connect as a superuser or the role that installed leasehold",
        ),
        Err(error) => failed_query("privilege.list", "check SELECT on lease.leases and lease.groups", &error),
    });
    findings
}

#[derive(QueryableByName)]
struct FlagRow {
    #[diesel(sql_type = Bool)]
    flag: bool,
}

/// `text` as an SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `name` as an SQL identifier, quoted unless it needs no quotes.
fn identifier(name: &str) -> String {
    let plain = name
        .chars()
        .enumerate()
        .all(|(i, c)| c == '_' || c.is_ascii_lowercase() || (i > 0 && c.is_ascii_digit()));
    if plain && !name.is_empty() {
        name.to_owned()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// Namespace rules that admit nobody but superusers, each with the
/// statement that repairs it. After a dump of another cluster is restored,
/// a rule whose role was not created here is one of them, and nothing else
/// says so: its role is simply refused. Finding `namespaces`.
fn namespaces(conn: &mut PgConnection) -> Finding {
    let allowed = diesel::sql_query(
        "SELECT has_function_privilege('lease.list_namespaces()', 'EXECUTE') AS flag",
    )
    .get_result::<FlagRow>(conn);
    match allowed {
        Ok(FlagRow { flag: true }) => {}
        Ok(FlagRow { flag: false }) => {
            return Finding::new(
                "namespaces",
                Status::Ok,
                "not checked: this role may not run lease.list_namespaces()",
                "run doctor as an operator or the role that installed leasehold to check the namespace rules",
            )
        }
        Err(error) => return failed_query("namespaces", "check EXECUTE on lease.list_namespaces()", &error),
    }
    let rules = match conn.list_namespaces() {
        Ok(rules) => rules,
        Err(error) => {
            return Finding::new(
                "namespaces",
                Status::Warn,
                format!("could not list the namespace rules: {error}"),
                "check the role's privileges and run doctor again",
            )
        }
    };
    let mut details = Vec::new();
    let mut actions = Vec::new();
    for rule in &rules {
        let prefix = literal(&rule.prefix);
        match &rule.role {
            BoundRole::Role(_) => {}
            BoundRole::Missing { name } => {
                details.push(format!(
                    "the rule for prefix {prefix} came from another cluster and names role {name:?}, which does not exist here"
                ));
                actions.push(format!(
                    "CREATE ROLE {} (the rule admits it from then on), or bind the prefix to the role that should have it: SELECT lease.bind_namespace({prefix}, {})",
                    identifier(name),
                    literal(name)
                ));
            }
            BoundRole::Dropped { oid } => {
                details.push(format!(
                    "the rule for prefix {prefix} names a role that was dropped or renamed (oid {oid})"
                ));
                actions.push(format!(
                    "bind the prefix to the role that should have it: SELECT lease.bind_namespace({prefix}, '<role>'), or remove the rule: SELECT lease.unbind_namespace({prefix})"
                ));
            }
            other => {
                details.push(format!("the rule for prefix {prefix} admits {other}"));
                actions.push(format!(
                    "bind the prefix again: SELECT lease.bind_namespace({prefix}, '<role>')"
                ));
            }
        }
    }
    if details.is_empty() {
        return Finding::new(
            "namespaces",
            Status::Ok,
            match rules.len() {
                0 => "no namespace rules: every role may act on every name".to_owned(),
                n => format!("{n} namespace rules, each bound to a role that exists"),
            },
            "nothing",
        );
    }
    Finding::new(
        "namespaces",
        Status::Warn,
        format!(
            "{} of {} namespace rules admit nobody but superusers: {}",
            details.len(),
            rules.len(),
            details.join("; ")
        ),
        actions.join("; "),
    )
}

#[derive(QueryableByName)]
struct SettingRow {
    #[diesel(sql_type = Text)]
    value: String,
}

fn setting(conn: &mut PgConnection, name: &str) -> Result<String, diesel::result::Error> {
    diesel::sql_query("SELECT current_setting($1) AS value")
        .bind::<Text, _>(name)
        .get_result::<SettingRow>(conn)
        .map(|row| row.value)
}

fn synchronous_commit(conn: &mut PgConnection) -> Finding {
    let (commit, fsync) = match (setting(conn, "synchronous_commit"), setting(conn, "fsync")) {
        (Ok(commit), Ok(fsync)) => (commit, fsync),
        (Err(error), _) | (_, Err(error)) => {
            return failed_query("synchronous_commit", "read the setting", &error)
        }
    };
    if fsync == "off" {
        return Finding::new(
            "synchronous_commit",
            Status::Fail,
            "fsync is off: a server crash can lose committed grants and releases, and epochs could be granted twice",
            "set fsync = on in postgresql.conf and reload",
        );
    }
    match commit.as_str() {
        "off" | "local" => Finding::new(
            "synchronous_commit",
            Status::Warn,
            format!("synchronous_commit = {commit} for this session: leasehold's own writes raise it to on for their transaction, but the application's other transactions (a write checked with check_held, say) are acknowledged before they are durable"),
            "ALTER ROLE <role> SET synchronous_commit = on (or in postgresql.conf), unless losing the last acknowledged application writes in a crash is acceptable",
        ),
        _ => Finding::new(
            "synchronous_commit",
            Status::Ok,
            format!("synchronous_commit = {commit}, fsync = on"),
            "nothing",
        ),
    }
}

#[derive(QueryableByName)]
struct StandbyRow {
    #[diesel(sql_type = Bool)]
    recovery: bool,
    #[diesel(sql_type = Text)]
    read_only: String,
}

fn standby(conn: &mut PgConnection) -> Finding {
    match diesel::sql_query(
        "SELECT pg_is_in_recovery() AS recovery, current_setting('default_transaction_read_only') AS read_only",
    )
    .get_result::<StandbyRow>(conn)
    {
        Ok(StandbyRow { recovery: true, .. }) => Finding::new(
            "standby",
            Status::Fail,
            "the server is a standby (in recovery): every acquire, renew and release is refused",
            "connect to the primary: list every host and add target_session_attrs=read-write to the URL",
        ),
        Ok(StandbyRow { read_only, .. }) if read_only == "on" => Finding::new(
            "standby",
            Status::Fail,
            "default_transaction_read_only is on: every acquire, renew and release is refused",
            "connect to the primary (target_session_attrs=read-write), or turn default_transaction_read_only off for the role",
        ),
        Ok(_) => Finding::new(
            "standby",
            Status::Ok,
            "the server is a primary and accepts writes",
            "nothing",
        ),
        Err(error) => failed_query("standby", "ask whether the server is in recovery", &error),
    }
}

#[derive(QueryableByName)]
struct PidRow {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pid: i32,
    #[diesel(sql_type = Nullable<diesel::sql_types::Integer>)]
    port: Option<i32>,
}

/// What a pooler can be told from here: two client sessions served by one
/// server session (their backend pids meet), or one client session whose
/// server session changes between statements: pooling in transaction or
/// statement mode. A server port other than the URL's says something
/// forwards the connection (a session-mode pooler or a proxy). What cannot
/// be told: a session-mode pooler on the server's own port looks like a
/// direct connection, and a transaction-mode pooler that happens to give
/// each client a server session of its own during the probe looks like one
/// too (the listener check then usually shows it: notifications do not
/// come through).
fn pooler(conn: &mut PgConnection, url: &str) -> Finding {
    let mut other = match connect::establish(url) {
        Ok(other) => other,
        Err(error) => {
            return Finding::new(
                "pooler",
                Status::Warn,
                format!("not checked: could not open a second session ({error})"),
                "check max_connections and the role's connection limit",
            )
        }
    };
    let mut ours = BTreeSet::new();
    let mut theirs = BTreeSet::new();
    let mut port = None;
    for _ in 0..5 {
        for (session, pids) in [(&mut *conn, &mut ours), (&mut other, &mut theirs)] {
            match diesel::sql_query(
                "SELECT pg_backend_pid() AS pid, current_setting('port')::int AS port",
            )
            .get_result::<PidRow>(session)
            {
                Ok(row) => {
                    pids.insert(row.pid);
                    port = row.port;
                }
                Err(error) => return failed_query("pooler", "read the backend pid", &error),
            }
        }
    }
    let shared = ours.intersection(&theirs).next().is_some();
    if shared || ours.len() > 1 || theirs.len() > 1 {
        return Finding::new(
            "pooler",
            Status::Warn,
            format!(
                "server sessions are shared or change between statements (backend pids {ours:?} and {theirs:?} for two client sessions): a pooler in transaction or statement mode"
            ),
            "use PreparedStatements::Uncached with the library's pools; waiters are not woken by notifications through it (they poll): point LeaseWaiter at the server or a session-mode pooler",
        );
    }
    match (url_port(url), port) {
        (Some(client), Some(server)) if i32::from(client) != server => Finding::new(
            "pooler",
            Status::Ok,
            format!("connected to port {client}, the server listens on {server}: a pooler in session mode or a proxy sits in between (fine for leasehold)"),
            "nothing",
        ),
        _ => Finding::new(
            "pooler",
            Status::Ok,
            "no pooler seen: each client session kept a server session of its own (a session-mode pooler on the server's own port cannot be told from a direct connection)",
            "nothing",
        ),
    }
}

/// The port of a `postgres://` URL with a single host, if it names one.
fn url_port(url: &str) -> Option<u16> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if host.contains(',') {
        return None;
    }
    let (_, port) = host.rsplit_once(':')?;
    if port.ends_with(']') {
        return None;
    }
    port.parse().ok()
}

/// Can a LISTEN session be opened, and does a NOTIFY from this session
/// reach it? That is what wakes waiters on a release.
fn listener(conn: &mut PgConnection, url: &str) -> Finding {
    let channel = format!("leasehold_doctor_{}", std::process::id());
    let mut listen = match connect::establish(url) {
        Ok(listen) => listen,
        Err(error) => {
            return Finding::new(
                "listener",
                Status::Warn,
                format!("could not open a second session for LISTEN: {error}"),
                "waiters need one extra connection each process; check max_connections and the role's connection limit",
            )
        }
    };
    if let Err(error) = listen.batch_execute(&format!("LISTEN {channel}")) {
        return failed_query("listener", "LISTEN", &error);
    }
    let token = format!("{}", Utc::now().timestamp_nanos_opt().unwrap_or_default());
    let sent = Instant::now();
    if let Err(error) = diesel::sql_query("SELECT pg_notify($1, $2) IS NULL AS flag")
        .bind::<Text, _>(&channel)
        .bind::<Text, _>(&token)
        .execute(conn)
    {
        return Finding::new(
            "listener",
            Status::Warn,
            format!("could not NOTIFY: {error}"),
            "on a standby NOTIFY is refused; connect to the primary",
        );
    }
    while sent.elapsed() < NOTIFY_WAIT {
        for notification in listen.notifications_iter() {
            match notification {
                Ok(n) if n.channel == channel && n.payload == token => {
                    return Finding::new(
                        "listener",
                        Status::Ok,
                        format!(
                            "a LISTEN session received this session's NOTIFY after {} ms: waiters are woken on release",
                            sent.elapsed().as_millis()
                        ),
                        "nothing",
                    )
                }
                Ok(_) => {}
                Err(error) => return failed_query("listener", "read notifications", &error),
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Finding::new(
        "listener",
        Status::Warn,
        format!(
            "a NOTIFY did not reach a LISTEN session within {}: waiters fall back to polling (slower wake-ups)",
            duration::format(NOTIFY_WAIT)
        ),
        "point waiters at the server or a session-mode pooler (a transaction-mode pooler drops notifications)",
    )
}

#[derive(QueryableByName)]
struct ClockRow {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

/// The server's clock against this machine's, with half the round trip as
/// the error bar.
fn clock(conn: &mut PgConnection) -> Finding {
    let before = Utc::now();
    let server =
        match diesel::sql_query("SELECT clock_timestamp() AS now").get_result::<ClockRow>(conn) {
            Ok(row) => row.now,
            Err(error) => return failed_query("clock", "read the server clock", &error),
        };
    let after = Utc::now();
    let half_trip = (after - before) / 2;
    let offset = server - (before + half_trip);
    let offset_ms = offset.num_milliseconds();
    let error_ms = half_trip.num_milliseconds();
    let direction = if offset_ms >= 0 { "ahead of" } else { "behind" };
    let detail = format!(
        "the server clock is {} ms {direction} this machine's (± {error_ms} ms)",
        offset_ms.abs()
    );
    let tolerance = i64::try_from(CLOCK_TOLERANCE.as_millis()).unwrap_or(i64::MAX);
    if offset_ms.abs() > tolerance + error_ms {
        Finding::new(
            "clock",
            Status::Warn,
            detail,
            "leases are decided on the server clock alone, but expiry times shown or turned into local deadlines are off by this much; run NTP (chrony) on both machines",
        )
    } else {
        Finding::new("clock", Status::Ok, detail, "nothing")
    }
}

#[derive(QueryableByName)]
struct SizeRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = BigInt)]
    table_bytes: i64,
    #[diesel(sql_type = BigInt)]
    index_bytes: i64,
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    total: i64,
    #[diesel(sql_type = BigInt)]
    held: i64,
    #[diesel(sql_type = BigInt)]
    free: i64,
    #[diesel(sql_type = BigInt)]
    lapsed: i64,
    #[diesel(sql_type = BigInt)]
    lapsed_idle: i64,
}

/// Table and index sizes, and the rows pruning would remove: FREE rows
/// (no release time is stored, so every FREE row counts) and LAPSED rows
/// whose grant expired longer than `idle` ago.
fn storage(conn: &mut PgConnection, idle: Duration) -> Finding {
    let sizes = match diesel::sql_query(
        "SELECT c.relname::text AS name, pg_relation_size(c.oid) AS table_bytes, \
                pg_indexes_size(c.oid) AS index_bytes \
           FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace \
          WHERE n.nspname = 'lease' AND c.relkind = 'r' ORDER BY 1",
    )
    .load::<SizeRow>(conn)
    {
        Ok(rows) => rows,
        Err(error) => return failed_query("storage", "read the table sizes", &error),
    };
    let sizes_text: Vec<String> = sizes
        .iter()
        .map(|row| {
            format!(
                "{} {} + indexes {}",
                row.name,
                bytes(row.table_bytes),
                bytes(row.index_bytes)
            )
        })
        .collect();
    let idle_seconds = i64::try_from(idle.as_secs()).unwrap_or(i64::MAX);
    let counts = diesel::sql_query(
        "SELECT count(*) AS total, \
                count(*) FILTER (WHERE owner IS NOT NULL AND expires_at > clock_timestamp()) AS held, \
                count(*) FILTER (WHERE owner IS NULL) AS free, \
                count(*) FILTER (WHERE owner IS NOT NULL AND expires_at <= clock_timestamp()) AS lapsed, \
                count(*) FILTER (WHERE owner IS NOT NULL \
                                   AND expires_at <= clock_timestamp() - make_interval(secs => $1)) AS lapsed_idle \
           FROM (SELECT l.owner, GREATEST(l.expires_at, g.expires_at) AS expires_at \
                   FROM lease.leases AS l LEFT JOIN lease.groups AS g ON g.id = l.group_id) AS l",
    )
    .bind::<BigInt, _>(idle_seconds)
    .get_result::<CountRow>(conn);
    match counts {
        Ok(count) => Finding::new(
            "storage",
            Status::Ok,
            format!(
                "{}; {} keys ({} held, {} lapsed, {} free); prunable: {} free and {} lapsed longer than {} ago",
                sizes_text.join(", "),
                count.total,
                count.held,
                count.lapsed,
                count.free,
                count.free,
                count.lapsed_idle,
                duration::format(idle)
            ),
            "pruning (leasehold prune) removes idle free and lapsed rows; nothing else to do",
        ),
        Err(_) => Finding::new(
            "storage",
            Status::Ok,
            format!(
                "{}; row counts need SELECT on lease.leases and lease.groups, which this role lacks",
                sizes_text.join(", ")
            ),
            "run doctor as the role that installed leasehold to see the prunable rows",
        ),
    }
}

fn bytes(value: i64) -> String {
    match value {
        v if v >= 10 * 1024 * 1024 => format!("{} MiB", v / (1024 * 1024)),
        v if v >= 10 * 1024 => format!("{} KiB", v / 1024),
        v => format!("{v} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::{upgrades_of_extension, url_port};
    use crate::commands::doctor::Status;

    /// The extension's own version is fine; any other is a mismatch to act on.
    #[test]
    fn an_extension_version_other_than_this_binarys_warns() {
        let latest = leasehold::admin::extension_version();
        assert_eq!(upgrades_of_extension(&latest, &latest).status, Status::Ok);
        let other = upgrades_of_extension("20261201000001.000000000000", &latest);
        assert_eq!(other.status, Status::Warn);
    }

    #[test]
    fn url_port_reads_a_single_hosts_port_only() {
        assert_eq!(url_port("postgres://u:p@h:6432/db"), Some(6432));
        assert_eq!(url_port("postgres://h:5432/db?x=1"), Some(5432));
        assert_eq!(url_port("postgres://h/db"), None);
        assert_eq!(url_port("postgres://h1:1,h2:2/db"), None);
        assert_eq!(url_port("host=h port=5"), None);
        assert_eq!(url_port("postgres://[::1]/db"), None);
    }
}
