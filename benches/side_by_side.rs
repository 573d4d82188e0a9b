//! leasehold side by side with the durable floor and with its peers, in one
//! run, on one server.
//!
//! Run: `cargo bench --bench side_by_side` (full: 10 s per row) or
//! `cargo bench --bench side_by_side -- --quick` (2 s per row). Options:
//! `--seconds N`, `--clients 1,4,16`, `--no-scale`, `--fsync-off` (a
//! server without durable commits).
//!
//! Every SQL workload is driven by `pgbench -M prepared` with per-transaction
//! latency logs (percentiles computed from the logs); the "Rust API" rows
//! run the same operations through leasehold's client with the same number
//! of connections, so the client's own overhead is visible. Peers are
//! modelled as the SQL they send (see `peer_scripts`), each in its own table.
//! The table goes to stdout and to `bench-results/<timestamp>.md`.
//!
//! The options, the server, the pgbench runner, the leasehold operations
//! (as SQL and through the sync API) and the "Rust API" threads are
//! benches/common/, which benches/async_side_by_side.rs (the async client
//! beside the sync one) runs too.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use diesel::connection::SimpleConnection;
use diesel::PgConnection;
use sha2::{Digest, Sha256};

mod common;
use common::{
    client_acquire, client_release, client_renew, query_text, run_pgbench, Op, Stats, Workload,
};

/// leasehold's rows send what the Rust client sends ([`client_acquire`],
/// [`client_renew`], [`client_release`]).
fn lease_scripts() -> Vec<Workload> {
    let owner = "'o' || :client_id";
    vec![
        Workload {
            group: "floor",
            name: "durable floor: 1-row PK UPDATE",
            script: "UPDATE bench_floor SET n = n + 1 WHERE id = :client_id + 1;\n".into(),
        },
        Op::Acquire.workload(),
        Op::Denied.workload(),
        Op::Renew.workload(),
        Op::Cycle.workload(),
        Workload {
            group: "leasehold",
            name: "W1-cycle (acq+renew+rel, 1 tx)",
            script: "BEGIN;\n".to_owned()
                + &client_acquire("'w1-' || :client_id", owner, "interval '30s'", true)
                + &client_renew("'w1-' || :client_id", owner, ":epoch", "interval '30s'")
                + &client_release("'w1-' || :client_id", owner, ":epoch")
                + "END;\n",
        },
        Workload {
            group: "leasehold",
            name: "W2-contend (4 shared keys)",
            script: "\\set k random(1, 4)\n".to_owned()
                + &client_acquire("'w2-' || :k", owner, "interval '1 millisecond'", false),
        },
    ]
}

/// Peers, modelled as the SQL they send (each statement autocommits unless
/// a transaction is written out).
fn peer_scripts() -> Vec<Workload> {
    vec![
        // ShedLock, database-time variant.
        Workload {
            group: "ShedLock",
            name: "ShedLock acquire -> unlock cycle",
            script: "INSERT INTO shedlock (name, lock_until, locked_at, locked_by) \
                     VALUES ('cyc-' || :client_id, now() + interval '30s', now(), 'host-' || :client_id) \
                     ON CONFLICT (name) DO UPDATE SET lock_until = now() + interval '30s', locked_at = now(), locked_by = 'host-' || :client_id \
                     WHERE shedlock.lock_until <= now();\n\
                     UPDATE shedlock SET lock_until = GREATEST(locked_at + interval '0s', now()) \
                     WHERE name = 'cyc-' || :client_id AND locked_by = 'host-' || :client_id;\n"
                .into(),
        },
        Workload {
            group: "ShedLock",
            name: "ShedLock extend",
            script: "UPDATE shedlock SET lock_until = now() + interval '1 hour' \
                     WHERE name = 'held-' || :client_id AND locked_by = 'host-' || :client_id AND lock_until > now();\n"
                .into(),
        },
        // Spring Integration JDBC lock repository.
        Workload {
            group: "Spring JDBC",
            name: "Spring acquire -> release cycle",
            script: "BEGIN;\n\
                     WITH u AS (UPDATE int_lock SET client_id = 'c-' || :client_id, created_date = now() \
                     WHERE region = 'DEFAULT' AND lock_key = 'cyc-' || :client_id \
                     AND (client_id = 'c-' || :client_id OR created_date < now() - interval '10s') RETURNING 1) \
                     SELECT count(*) AS updated FROM u \\gset\n\
                     \\if :updated = 0\n\
                     INSERT INTO int_lock (region, lock_key, client_id, created_date) VALUES ('DEFAULT', 'cyc-' || :client_id, 'c-' || :client_id, now());\n\
                     \\endif\n\
                     END;\n\
                     DELETE FROM int_lock WHERE region = 'DEFAULT' AND lock_key = 'cyc-' || :client_id AND client_id = 'c-' || :client_id;\n"
                .into(),
        },
        Workload {
            group: "Spring JDBC",
            name: "Spring renew",
            script: "UPDATE int_lock SET created_date = now() WHERE region = 'DEFAULT' AND lock_key = 'held-' || :client_id AND client_id = 'c-' || :client_id;\n".into(),
        },
        // cirello pglock.
        Workload {
            group: "pglock",
            name: "pglock acquire -> release cycle",
            script: "SELECT nextval('locks_rvn') AS rvn \\gset\n\
                     INSERT INTO locks (name, record_version_number, data, owner) VALUES ('cyc-' || :client_id, :rvn, NULL, 'o-' || :client_id) \
                     ON CONFLICT (name) DO UPDATE SET record_version_number = :rvn, owner = 'o-' || :client_id \
                     WHERE locks.record_version_number IS NULL;\n\
                     DELETE FROM locks WHERE name = 'cyc-' || :client_id AND record_version_number = :rvn;\n"
                .into(),
        },
        Workload {
            group: "pglock",
            name: "pglock heartbeat",
            script: "SELECT record_version_number AS old FROM locks WHERE name = 'held-' || :client_id \\gset\n\
                     SELECT nextval('locks_rvn') AS rvn \\gset\n\
                     UPDATE locks SET record_version_number = :rvn WHERE name = 'held-' || :client_id AND record_version_number = :old;\n"
                .into(),
        },
        // Advisory locks: a reference (not durable, no expiry, no fencing).
        Workload {
            group: "advisory (reference)",
            name: "advisory session lock -> unlock",
            script: "SELECT pg_try_advisory_lock(:client_id);\nSELECT pg_advisory_unlock(:client_id);\n".into(),
        },
        Workload {
            group: "advisory (reference)",
            name: "advisory xact lock (1 tx)",
            script: "BEGIN;\nSELECT pg_try_advisory_xact_lock(:client_id);\nEND;\n".into(),
        },
    ]
}

const SETUP: &str = "
DROP TABLE IF EXISTS bench_floor, shedlock, int_lock, locks;
DROP SEQUENCE IF EXISTS locks_rvn;
CREATE TABLE bench_floor (id int PRIMARY KEY, n bigint NOT NULL);
INSERT INTO bench_floor SELECT g, 0 FROM generate_series(1, 64) g;
CREATE TABLE shedlock (name varchar(64) PRIMARY KEY, lock_until timestamp NOT NULL, locked_at timestamp NOT NULL, locked_by varchar(255) NOT NULL);
CREATE TABLE int_lock (lock_key char(36) NOT NULL, region varchar(100) NOT NULL, client_id char(36), created_date timestamp NOT NULL, PRIMARY KEY (lock_key, region));
CREATE TABLE locks (name text PRIMARY KEY, record_version_number bigint, data bytea, owner text);
CREATE SEQUENCE locks_rvn;
INSERT INTO shedlock SELECT 'held-' || g, now() + interval '1 hour', now(), 'host-' || g FROM generate_series(0, 63) g;
INSERT INTO int_lock SELECT 'held-' || g, 'DEFAULT', 'c-' || g, now() FROM generate_series(0, 63) g;
INSERT INTO locks SELECT 'held-' || g, nextval('locks_rvn'), NULL, 'o-' || g FROM generate_series(0, 63) g;
";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = common::options();
    let bench = common::start_server(&options, 100)?;
    let (url, bin) = (bench.url.clone(), bench.bin.clone());
    let mut conn = common::connect(&url);
    common::prepare(&mut conn)?;
    conn.batch_execute(SETUP)?;
    let work_dir = common::work_dir("bench")?;

    let mut report = String::new();
    let timestamp = chrono::Utc::now().format("%Y-%m-%dT%H-%M-%SZ").to_string();
    writeln!(report, "## Benchmark {timestamp}\n")?;
    writeln!(
        report,
        "{}; ratios are p50 and ops/s relative to the leasehold row named in `vs`.\n",
        common::environment(&mut conn, &bench, options.seconds)
    )?;
    writeln!(report, "| group | workload | clients | ops/s | p50 µs | p95 µs | p99 µs | vs | p50 ratio | ops/s ratio |")?;
    writeln!(report, "|---|---|---:|---:|---:|---:|---:|---|---:|---:|")?;
    print!("{report}");

    let mut results: BTreeMap<(String, usize), Stats> = BTreeMap::new();
    let emit = |report: &mut String,
                group: &str,
                name: &str,
                clients: usize,
                stats: Stats,
                reference: Option<(&str, Stats)>| {
        let (vs, p50_ratio, ops_ratio) = match reference {
            Some((ref_name, r)) => (
                ref_name.to_owned(),
                stats.p50_us / r.p50_us,
                stats.ops_per_sec / r.ops_per_sec,
            ),
            None => ("—".to_owned(), 1.0, 1.0),
        };
        let line = format!(
            "| {group} | {name} | {clients} | {:.0} | {:.0} | {:.0} | {:.0} | {vs} | {p50_ratio:.2} | {ops_ratio:.2} |\n",
            stats.ops_per_sec, stats.p50_us, stats.p95_us, stats.p99_us
        );
        print!("{line}");
        report.push_str(&line);
    };

    let lease = lease_scripts();
    let peers = peer_scripts();
    for &clients in &options.clients {
        for workload in &lease {
            let stats = run_pgbench(&bin, &url, &work_dir, workload, clients, options.seconds);
            results.insert((workload.name.to_owned(), clients), stats);
            let reference = if workload.group == "floor" {
                None
            } else {
                results
                    .get(&("durable floor: 1-row PK UPDATE".to_owned(), clients))
                    .map(|s| ("durable floor", *s))
            };
            emit(
                &mut report,
                workload.group,
                workload.name,
                clients,
                stats,
                reference,
            );
        }
        for op in Op::ALL {
            let stats =
                common::run_threads(clients, options.seconds, op, |_| common::connect(&url));
            let reference = results
                .get(&(op.name().to_owned(), clients))
                .map(|s| ("same SQL via pgbench", *s));
            emit(
                &mut report,
                "Rust API",
                &format!("{} via leasehold client", op.name()),
                clients,
                stats,
                reference,
            );
        }
        for workload in &peers {
            let stats = run_pgbench(&bin, &url, &work_dir, workload, clients, options.seconds);
            let reference_name = if workload.name.contains("cycle")
                || workload.name.contains("->")
                || workload.name.contains("1 tx")
            {
                "acquire -> release cycle"
            } else {
                "renew"
            };
            let reference = results
                .get(&(reference_name.to_owned(), clients))
                .map(|s| (reference_name, *s));
            emit(
                &mut report,
                workload.group,
                workload.name,
                clients,
                stats,
                reference,
            );
        }
    }

    if !options.has("--no-scale") {
        writeln!(report, "\n| keys present | workload | clients | ops/s | p50 µs | p95 µs | p99 µs | p50 ratio to 1k |")?;
        writeln!(report, "|---:|---|---:|---:|---:|---:|---:|---:|")?;
        let scale_script = |keys: usize| Workload {
            group: "scale",
            name: "scale acquire",
            script: format!("\\set k random(1, {keys})\n")
                + &client_acquire(
                    "'scale-' || :k",
                    "'o' || :client_id",
                    "interval '1 microsecond'",
                    false,
                ),
        };
        let mut baseline: Option<Stats> = None;
        for keys in [1_000_usize, 1_000_000] {
            conn.batch_execute(&format!(
                "INSERT INTO lease.leases (key, key_hash, owner, epoch, expires_at, first_epoch) \
                 SELECT 'scale-' || g, lease._key_hash('scale-' || g), NULL, 1, NULL, 1 FROM generate_series(1, {keys}) g ON CONFLICT DO NOTHING"
            ))?;
            conn.batch_execute("VACUUM ANALYZE lease.leases")?;
            let stats = run_pgbench(
                &bin,
                &url,
                &work_dir,
                &scale_script(keys),
                1,
                options.seconds,
            );
            let ratio = baseline.map_or(1.0, |b| stats.p50_us / b.p50_us);
            baseline.get_or_insert(stats);
            let line = format!(
                "| {keys} | acquire of a random existing key | 1 | {:.0} | {:.0} | {:.0} | {:.0} | {ratio:.2} |\n",
                stats.ops_per_sec, stats.p50_us, stats.p95_us, stats.p99_us
            );
            print!("{line}");
            report.push_str(&line);
        }
    }

    many_keys_section(
        &mut conn,
        &bin,
        &url,
        &work_dir,
        options.seconds,
        &mut report,
    )?;

    let path = common::write_results(&format!("{timestamp}.md"), &report)?;
    println!("\nwritten to {}", path.display());
    let _ = std::fs::remove_dir_all(&work_dir);
    drop(bench);
    Ok(())
}

/// How many keys the heartbeat section's worker holds.
const HEARTBEAT_KEYS: usize = 1_000;

/// Many keys, one heartbeat: a worker holding [`HEARTBEAT_KEYS`] keys keeps
/// them alive with one `lease.renew_many` call, or, once the keys are
/// joined to a heartbeat group, one `lease.renew_group` call (what
/// `KeeperSet` sends), against one renew per key
/// (what the Rust client sends: the SQL function) and ShedLock's extend of each lock (ShedLock has
/// no batch extend). One client: a heartbeat is one worker's. The keys,
/// epochs and the keys' digests (which the Rust client sends with a batch)
/// travel as array literals in the prepared statement, as a client sends
/// them as parameters; each of the per-key workloads is one pgbench
/// transaction of 1,000 autocommitted statements. The floor is one plain
/// UPDATE of 1,000 rows by primary key in one statement: what any batch
/// that writes each key's row costs at least.
fn many_keys_section(
    conn: &mut PgConnection,
    bin: &Path,
    url: &str,
    work_dir: &Path,
    seconds: u64,
    report: &mut String,
) -> Result<(), Box<dyn std::error::Error>> {
    let n = HEARTBEAT_KEYS;
    conn.batch_execute(&format!(
        "DROP TABLE IF EXISTS bench_many_floor;
         CREATE TABLE bench_many_floor (id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO bench_many_floor SELECT g, 0 FROM generate_series(1, {n}) g;
         INSERT INTO shedlock SELECT 'hb-' || g, now() + interval '1 hour', now(), 'hb-host'
           FROM generate_series(1, {n}) g ON CONFLICT (name) DO NOTHING;
         SELECT count(*) FROM (SELECT lease.acquire('hb-' || g, 'hb', interval '100 years')
           FROM generate_series(1, {n}) g) s;"
    ))?;
    // On its own: a multi-statement batch runs as one transaction.
    conn.batch_execute("VACUUM ANALYZE lease.leases, shedlock, bench_many_floor")?;
    let epochs = query_text(
        conn,
        "SELECT string_agg(DISTINCT epoch::text, ',') AS value FROM lease.leases WHERE key LIKE 'hb-%' AND owner = 'hb'",
    );
    let epoch: i64 = epochs
        .parse()
        .map_err(|_| format!("heartbeat keys have epochs {epochs:?}, expected one"))?;
    let keys: Vec<String> = (1..=n).map(|i| format!("hb-{i}")).collect();
    let key_array = format!("'{{{}}}'::text[]", keys.join(","));
    let epoch_array = format!("'{{{}}}'::bigint[]", vec![epoch.to_string(); n].join(","));
    // The keys' digests, as the Rust client sends them with a batch.
    let hash_array = format!(
        "'{{{}}}'::bytea[]",
        keys.iter()
            .map(|key| {
                let digest = Sha256::digest(key.as_bytes());
                let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
                format!("\"\\\\x{hex}\"")
            })
            .collect::<Vec<_>>()
            .join(",")
    );
    // The same keys joined to one heartbeat group (their per-key rows stay
    // as they are for the other workloads: a member can still be renewed
    // on its own).
    let group = query_text(
        conn,
        &format!(
            "SELECT DISTINCT group_id::text AS value \
               FROM lease.join_group({key_array}, 'hb', {epoch_array}, interval '100 years', {hash_array})"
        ),
    );
    let group: i64 = group
        .parse()
        .map_err(|_| format!("joining the heartbeat keys gave group {group:?}, expected one"))?;
    let per_key =
        |line: &dyn Fn(&str) -> String| keys.iter().map(|key| line(key)).collect::<String>();
    let workloads = [
        (
            "leasehold: one renew (the unit)",
            1,
            client_renew("'hb-1'", "'hb'", &epoch.to_string(), "interval '1 hour'"),
        ),
        (
            "floor: one UPDATE of 1,000 rows by primary key",
            n,
            format!("UPDATE bench_many_floor SET n = n + 1 WHERE id = ANY ('{{{}}}'::int[]);\n",
                (1..=n).map(|i| i.to_string()).collect::<Vec<_>>().join(",")),
        ),
        (
            "leasehold: heartbeat of 1,000 keys, one renew_many",
            n,
            format!("SELECT count(*) FROM lease.renew_many({key_array}, 'hb', {epoch_array}, interval '1 hour', {hash_array});\n"),
        ),
        (
            "leasehold: heartbeat of 1,000 keys in one group, one renew_group",
            n,
            format!("SELECT status, members FROM lease.renew_group({group}, 'hb', interval '1 hour');\n"),
        ),
        (
            "leasehold: 1,000 single renews",
            n,
            per_key(&|key| client_renew(&format!("'{key}'"), "'hb'", &epoch.to_string(), "interval '1 hour'")),
        ),
        (
            "ShedLock: extend of 1,000 locks, one UPDATE each",
            n,
            per_key(&|key| format!("UPDATE shedlock SET lock_until = now() + interval '1 hour' \
                WHERE name = '{key}' AND locked_by = 'hb-host' AND lock_until > now();\n")),
        ),
    ];
    writeln!(report, "\n| heartbeat of {n} keys | keys per tx | tx/s | p50 µs | p95 µs | p99 µs | p50 µs per key | p50 / one single renew |")?;
    writeln!(report, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
    let mut unit: Option<f64> = None;
    for (name, keys_per_tx, script) in workloads {
        let workload = Workload {
            group: "heartbeat",
            name,
            script,
        };
        let stats = run_pgbench(bin, url, work_dir, &workload, 1, seconds);
        if keys_per_tx == 1 {
            unit = Some(stats.p50_us);
        }
        let ratio = unit.map_or(f64::NAN, |unit| stats.p50_us / unit);
        let line = format!(
            "| {name} | {keys_per_tx} | {:.1} | {:.0} | {:.0} | {:.0} | {:.2} | {ratio:.1} |\n",
            stats.ops_per_sec,
            stats.p50_us,
            stats.p95_us,
            stats.p99_us,
            stats.p50_us / keys_per_tx as f64
        );
        print!("{line}");
        report.push_str(&line);
    }
    Ok(())
}
