//! docs/SPECIFICATION.md §1.7 and I13: epochs stay ordered across a
//! promotion, a restore onto a new timeline and a dump restored into a new
//! cluster; a synchronous standby loses no acknowledged call; a server that
//! was never promoted keeps pg_lease's epochs exactly (§1.2); and an
//! operator can raise the generation (§4.1).
//!
//! Each test runs its own servers on built-in streaming replication (the
//! machine's PostgreSQL binaries: initdb, pg_basebackup, pg_ctl, pg_dump,
//! psql), started by `leasehold-local` and removed on drop or panic. Waits
//! follow what the servers report (`pg_stat_replication`, replay positions,
//! `pg_is_in_recovery()`); nothing sleeps on hope, and nothing asserts on
//! timing.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use leasehold::admin::Operator;
use leasehold::guard::Check;
use leasehold::guard::Fencing;
use leasehold::{
    error::LeaseError, Acquisition, ErrorKind, Lease, LeaseState, Leases, Refusal, Release,
};
use leasehold_local::{BackupMode, LocalPostgres, StopMode};
use leasehold_object_store::object_store::memory::InMemory;
use leasehold_object_store::object_store::path::Path as ObjectPath;
use leasehold_object_store::{FenceError as ObjectFenceError, FencedStore};
use leasehold_test_support::replication::{connect, start};
use leasehold_test_support::{query_lines, ReplicatedPair};

const TTL: Duration = Duration::from_secs(600);
/// The first epoch of generation 1: every epoch of generation 0 is below it.
const GENERATION_1: i64 = (1 << 40) + 1;

fn granted(acquisition: Acquisition) -> Lease {
    match acquisition {
        Acquisition::Granted(lease) => lease,
        Acquisition::Denied => panic!("expected a grant, got a denial"),
    }
}

fn grant(conn: &mut PgConnection, key: &str, owner: &str) -> Lease {
    granted(conn.acquire(key, owner, TTL).expect("acquire"))
}

fn release_ok(conn: &mut PgConnection, lease: &Lease) {
    assert_eq!(conn.release(&lease).expect("release"), Release::Released);
}

fn state(conn: &mut PgConnection, key: &str) -> LeaseState {
    conn.inspect(key)
        .expect("inspect")
        .unwrap_or_else(|| panic!("key {key} is absent"))
}

/// A private directory for fenced files, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("leasehold-failover-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// §1.7, I13, scenario 1: an asynchronous standby is cut off (stopped)
/// while the old primary goes on granting, a key it had seen to epoch 3 and
/// a key it never saw. The old primary dies and the standby is promoted. The
/// new grants of both keys are above every epoch the old primary granted,
/// and a database guard, a fenced file and a fenced object that saw the old
/// primary's epochs accept the new holder and refuse the old holder.
/// (Before generations, the promoted server granted epoch 3 again: two
/// holders with one epoch, both admitted by the file and object guards.)
#[test]
fn async_standby_promoted_after_missing_grants_grants_above_them_and_guards_refuse_the_old_holder()
{
    let pair = ReplicatedPair::start(false);
    let mut old = pair.primary_conn();
    let dir = TempDir::new("async");
    let file = leasehold_fs::FencedFile::new(dir.0.join("report")).expect("fenced file");
    let store = FencedStore::new(Arc::new(InMemory::new())).expect("in-memory store");
    let object = ObjectPath::from("report");

    // Replicated: a grant, its guarded writes, its release.
    let first = grant(&mut old, "seen", "old-a");
    assert_eq!(first.epoch(), 1);
    old.admit("db-resource", &first, Check::Token)
        .expect("database guard admits epoch 1");
    file.write(first.token(), b"a")
        .expect("file admits epoch 1");
    store
        .write(&object, first.token(), "a")
        .expect("object admits epoch 1");
    release_ok(&mut old, &first);
    pair.wait_caught_up();

    // Cut off: the standby is down while the old primary grants on.
    pair.standby.stop(StopMode::Fast).expect("stop the standby");
    let stale = grant(&mut old, "seen", "old-b");
    assert_eq!(stale.epoch(), 3);
    let fresh_old = grant(&mut old, "fresh", "old-c");
    assert_eq!(fresh_old.epoch(), 1);
    old.admit("db-resource", &stale, Check::Token)
        .expect("old primary's guard admits epoch 3");
    file.write(stale.token(), b"b")
        .expect("file admits epoch 3");
    store
        .write(&object, stale.token(), "b")
        .expect("object admits epoch 3");
    drop(old);
    pair.primary
        .kill_postmaster()
        .expect("the old primary dies");

    pair.standby
        .restart()
        .expect("the standby comes back, still a standby");
    pair.standby.promote().expect("promote the standby");
    let mut new = pair.standby_conn();
    // What the promoted server had replayed: the released first grant.
    assert_eq!(
        state(&mut new, "seen"),
        LeaseState::Free {
            epoch: 2.into(),
            force_released: false
        }
    );
    assert!(new.inspect("fresh").expect("inspect").is_none());

    let winner = grant(&mut new, "seen", "new-a");
    let fresh_new = grant(&mut new, "fresh", "new-c");
    for lease in [&winner, &fresh_new] {
        assert!(
            lease.epoch() > stale.epoch() && lease.epoch() > fresh_old.epoch(),
            "new grant {} must order above every old grant (3 and 1)",
            lease.epoch()
        );
        assert_eq!(lease.epoch(), GENERATION_1);
    }
    let now = new.generation().expect("generation");
    assert_eq!((now.generation, now.timeline), (1, 2));
    assert_eq!(now.floor_epoch(), GENERATION_1);

    // The database guard on the promoted server (it saw epoch 1 only).
    new.admit("db-resource", &winner, Check::Token)
        .expect("database guard admits the new holder");
    for old_token in [first.token(), stale.token()] {
        match new.admit("db-resource", &old_token, Check::Token) {
            Err(e)
                if e.kind() == ErrorKind::Fenced
                    && matches!(e.refusal(), Some(Refusal::StaleEpoch { .. })) =>
            {
                assert_eq!(e.epoch(), Some(old_token.epoch()))
            }
            other => panic!(
                "database guard must refuse old epoch {}: {other:?}",
                old_token.epoch()
            ),
        }
    }
    // The external guards saw the old primary's epoch 3.
    file.write(winner.token(), b"c")
        .expect("file admits the new holder");
    let refused = file
        .write(stale.token(), b"stale")
        .expect_err("file refuses the old holder");
    assert!(refused.is_stale(), "{refused:?}");
    assert_eq!(
        file.read().expect("read the file"),
        (winner.epoch(), b"c".to_vec())
    );
    store
        .write(&object, winner.token(), "c")
        .expect("object admits the new holder");
    match store.write(&object, stale.token(), "stale") {
        Err(ObjectFenceError::StaleEpoch {
            presented,
            accepted,
            ..
        }) => {
            assert_eq!((presented, accepted), (stale.epoch(), winner.epoch()));
        }
        other => panic!("the object store must refuse the old holder: {other:?}"),
    }
}

/// §1.7, scenario 2: with a synchronous standby, every acknowledged grant
/// and release is on the standby when the primary is SIGKILLed right after,
/// so the promoted server has the same holders and epochs; its next grants
/// order above every old epoch.
#[test]
fn sync_standby_promoted_after_the_primary_is_killed_has_every_acknowledged_call() {
    let pair = ReplicatedPair::start(true);
    let mut old = pair.primary_conn();
    let a = grant(&mut old, "k1", "a");
    let b = grant(&mut old, "k2", "b");
    release_ok(&mut old, &b);
    let c = grant(&mut old, "k2", "c");
    let d = grant(&mut old, "k3", "d");
    assert_eq!(
        (a.epoch(), b.epoch(), c.epoch(), d.epoch()),
        (
            leasehold::Epoch::new(1),
            leasehold::Epoch::new(1),
            leasehold::Epoch::new(3),
            leasehold::Epoch::new(1)
        )
    );
    let released = grant(&mut old, "k4", "e");
    release_ok(&mut old, &released);
    drop(old);
    pair.primary.kill_postmaster().expect("SIGKILL the primary");
    pair.standby
        .promote()
        .expect("promote the synchronous standby");

    let mut new = pair.standby_conn();
    for lease in [&a, &c, &d] {
        match state(&mut new, lease.key()) {
            LeaseState::Held {
                owner,
                epoch,
                expires_at,
            } => assert_eq!(
                (owner.as_str(), epoch, expires_at),
                (lease.owner(), lease.epoch(), lease.expires_at()),
                "acknowledged grant of {} lost",
                lease.key()
            ),
            other => panic!("acknowledged grant of {} lost: {other:?}", lease.key()),
        }
    }
    assert_eq!(
        state(&mut new, "k4"),
        LeaseState::Free {
            epoch: 2.into(),
            force_released: false
        }
    );
    let after_release = grant(&mut new, "k4", "f");
    let never_seen = grant(&mut new, "k5", "g");
    assert_eq!(after_release.epoch(), GENERATION_1);
    assert_eq!(never_seen.epoch(), GENERATION_1);
    assert_eq!(new.generation().expect("generation").generation, 1);
    let taken_over = new.force_release("k2").expect("force release");
    assert_eq!(taken_over, Some(leasehold::Epoch::new(4)));
    assert_eq!(grant(&mut new, "k2", "h").epoch(), GENERATION_1);
}

/// Runs one of the server's client programs (pg_dump, psql), panicking with
/// its output when it fails.
fn run_client(server: &LocalPostgres, program: &str, args: &[&str]) {
    let out = Command::new(server.tool_path(program))
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// §1.7, scenario 3: a pg_dump restored into a new cluster (a new system
/// identifier, timeline 1 again) starts a new lineage one generation above
/// the dump's, so its grants order above everything granted before the dump
/// and above what the source granted after it in its generation.
#[test]
fn dump_restored_into_a_new_cluster_grants_above_the_source() {
    let source = start(LocalPostgres::builder().durable(false));
    let mut src = connect(&source);
    leasehold::install(&mut src).expect("install");
    leasehold_test_support::database::apply_sql_patch(&mut src);
    let first = grant(&mut src, "k1", "a");
    release_ok(&mut src, &first);
    let held = grant(&mut src, "k1", "b");
    assert_eq!(held.epoch(), 3);
    release_ok(&mut src, &held);

    let dir = TempDir::new("dump");
    let dump = dir.0.join("dump.sql");
    let dump_path = dump.to_string_lossy().into_owned();
    run_client(&source, "pg_dump", &["-d", &source.url(), "-f", &dump_path]);

    // The source goes on granting in its generation after the dump.
    let after_dump = grant(&mut src, "k1", "c");
    assert_eq!(after_dump.epoch(), 5);
    let new_key_at_source = grant(&mut src, "k2", "d");
    assert_eq!(new_key_at_source.epoch(), 1);

    let target = start(LocalPostgres::builder().durable(false));
    run_client(
        &target,
        "psql",
        &[
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &target.url(),
            "-f",
            &dump_path,
        ],
    );
    let mut dst = connect(&target);
    assert_eq!(
        state(&mut dst, "k1"),
        LeaseState::Free {
            epoch: 4.into(),
            force_released: false
        }
    );
    let restored_k1 = grant(&mut dst, "k1", "x");
    let restored_k2 = grant(&mut dst, "k2", "y");
    assert_eq!(restored_k1.epoch(), GENERATION_1);
    assert_eq!(restored_k2.epoch(), GENERATION_1);
    assert!(restored_k1.epoch() > after_dump.epoch());
    assert!(restored_k2.epoch() > new_key_at_source.epoch());
    // The new lineage is recorded: later grants stay in it.
    release_ok(&mut dst, &restored_k1);
    assert_eq!(grant(&mut dst, "k1", "z").epoch(), GENERATION_1 + 2);
    assert_eq!(dst.generation().expect("generation").generation, 1);
}

/// §1.7, scenario 4: a restore from a base backup that recovers to the
/// backup's consistency point and promotes (a point-in-time recovery) is on
/// a new timeline, so its grants order above everything the source granted,
/// also after the backup.
#[test]
fn restore_from_a_base_backup_onto_a_new_timeline_grants_above_the_source() {
    let source = start(LocalPostgres::builder().durable(false));
    let mut src = connect(&source);
    leasehold::install(&mut src).expect("install");
    leasehold_test_support::database::apply_sql_patch(&mut src);
    let first = grant(&mut src, "k1", "a");
    release_ok(&mut src, &first);

    let restored = start(
        LocalPostgres::builder()
            .durable(false)
            .from_base_backup(&source, BackupMode::RestoreAndPromote),
    );
    // The source grants on after the backup, then is lost.
    let after_backup = grant(&mut src, "k1", "b");
    assert_eq!(after_backup.epoch(), 3);
    let new_key_at_source = grant(&mut src, "k2", "c");
    drop(src);
    source.kill_postmaster().expect("the source dies");

    let mut dst = connect(&restored);
    assert_eq!(
        state(&mut dst, "k1"),
        LeaseState::Free {
            epoch: 2.into(),
            force_released: false
        }
    );
    let k1 = grant(&mut dst, "k1", "x");
    let k2 = grant(&mut dst, "k2", "y");
    assert!(k1.epoch() > after_backup.epoch(), "{}", k1.epoch());
    assert!(k2.epoch() > new_key_at_source.epoch(), "{}", k2.epoch());
    assert_eq!(
        (k1.epoch(), k2.epoch()),
        (
            leasehold::Epoch::new(GENERATION_1),
            leasehold::Epoch::new(GENERATION_1)
        )
    );
    let now = dst.generation().expect("generation");
    assert_eq!((now.generation, now.timeline), (1, 2));
    // The lineage row records the newest timeline its grants ran on, so a
    // dump of this database, restored elsewhere, starts its new lineage
    // above the generation this timeline gave (§1.7) from the row alone.
    assert_eq!(
        leasehold_test_support::query_lines(
            &mut dst,
            "SELECT last_timeline::text AS line FROM lease.lineage"
        ),
        ["2"]
    );
}

/// §1.2, scenario 5: a server that was never promoted, with a standby
/// attached, through a clean restart and a crash, grants exactly 1, 2, 3,
/// ...: counter + 1, generation 0. The standby reports generation 0 too.
#[test]
fn a_never_promoted_server_keeps_pg_leases_epochs_exactly() {
    let pair = ReplicatedPair::start(false);
    let mut conn = pair.primary_conn();
    let now = conn.generation().expect("generation");
    assert_eq!(
        (now.generation, now.timeline, now.floor_epoch()),
        (0, 1, leasehold::Epoch::new(1))
    );
    let mut expected = 1;
    for round in 0..3 {
        let lease = grant(&mut conn, "k", &format!("owner-{round}"));
        assert_eq!(lease.epoch(), expected);
        release_ok(&mut conn, &lease);
        expected += 2;
        assert_eq!(grant(&mut conn, &format!("new-{round}"), "o").epoch(), 1);
        match round {
            0 => pair.primary.restart().expect("clean restart"),
            1 => {
                pair.primary.kill_postmaster().expect("crash");
                pair.primary.restart().expect("crash recovery");
            }
            _ => {}
        }
        conn = pair.primary_conn();
    }
    assert_eq!(
        state(&mut conn, "k"),
        LeaseState::Free {
            epoch: 6.into(),
            force_released: false
        }
    );
    pair.wait_caught_up();
    let mut standby = pair.standby_conn();
    assert_eq!(
        standby
            .generation()
            .expect("generation on the standby")
            .generation,
        0
    );
    assert_eq!(
        state(&mut standby, "k"),
        LeaseState::Free {
            epoch: 6.into(),
            force_released: false
        }
    );
}

/// §1.7, what breaks the guarantee: a split brain. The standby is promoted
/// while the old primary keeps running and accepting writes — what an HA
/// manager that dies without a watchdog to stop its postmaster leaves
/// behind. Both primaries then grant the same lapsed key to different
/// owners at the same time: I1 does not hold across two writable
/// primaries, which is why the documentation names a split brain as what
/// breaks the guarantee. What still holds: the promoted server is on a
/// later timeline, so its generation is higher and each of its epochs is
/// above each of the old primary's; a guard both sides share (a fenced
/// file) refuses the old primary's holder as soon as the promoted server's
/// holder has written.
#[test]
fn a_split_brain_grants_a_key_twice_but_a_shared_guard_prefers_the_promoted_servers_holder() {
    let pair = ReplicatedPair::start(false);
    let mut old = pair.primary_conn();
    let dir = TempDir::new("split");
    let file = leasehold_fs::FencedFile::new(dir.0.join("report")).expect("fenced file");
    let first = granted(
        old.acquire("job", "a", Duration::from_millis(300))
            .expect("acquire"),
    );
    pair.wait_caught_up();
    pair.standby
        .promote()
        .expect("promote the standby while the old primary runs");
    let mut new = pair.standby_conn();
    leasehold_test_support::wait_until_server_time_passes(&mut old, first.expires_at());
    leasehold_test_support::wait_until_server_time_passes(&mut new, first.expires_at());

    let on_old = grant(&mut old, "job", "old-b");
    let on_new = grant(&mut new, "job", "new-c");
    assert!(
        matches!(state(&mut old, "job"), LeaseState::Held { ref owner, .. } if owner == "old-b")
    );
    assert!(
        matches!(state(&mut new, "job"), LeaseState::Held { ref owner, .. } if owner == "new-c"),
        "two holders at once: the split brain breaks I1"
    );
    let old_generation = old.generation().expect("generation").generation;
    let new_generation = new.generation().expect("generation").generation;
    assert!(
        new_generation > old_generation,
        "{new_generation} > {old_generation}"
    );
    assert!(on_new.epoch() > on_old.epoch());

    file.write(on_old.token(), b"old")
        .expect("the old primary's holder writes first");
    file.write(on_new.token(), b"new")
        .expect("the promoted server's holder writes");
    let refused = file
        .write(on_old.token(), b"old again")
        .expect_err("the old primary's holder is fenced at the shared guard");
    assert!(refused.is_stale(), "{refused:?}");
}

/// §1.8 with §1.7 (I16 and I13 together): keys pruned on the primary (the
/// watermark replicated), one of them granted again on the old primary
/// while the asynchronous standby was cut off, then a promotion. The
/// promoted server, which never saw that grant, grants the key above both
/// the watermark and the old primary's epochs (the generation), and its
/// database guard, whose record was pruned, refuses every old epoch as
/// stale and admits the new holder.
#[test]
fn pruned_keys_stay_ordered_and_fenced_across_a_promotion() {
    let pair = ReplicatedPair::start(false);
    let mut old = pair.primary_conn();
    let first = grant(&mut old, "job", "old-a");
    old.admit("job-output", &first, Check::Token)
        .expect("admit epoch 1");
    release_ok(&mut old, &first);
    // Prune until the key and its record are gone: the first prune records
    // the FREE key, a prune 1 ms later (server clock) removes it.
    let options = leasehold::admin::PruneOptions::new(Duration::from_millis(1));
    old.prune(&options).expect("first prune");
    let seen = leasehold_test_support::server_now(&mut old);
    leasehold_test_support::wait_until_server_time_passes(
        &mut old,
        seen + chrono::Duration::milliseconds(1),
    );
    let report = old.prune(&options).expect("second prune");
    assert_eq!(
        (report.keys_pruned, report.guards_pruned),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(report.watermark, 2, "the released key's counter");
    pair.wait_caught_up();

    // Cut off: the old primary grants the key again, above the watermark.
    pair.standby.stop(StopMode::Fast).expect("stop the standby");
    let again = grant(&mut old, "job", "old-b");
    assert_eq!(again.epoch(), 3, "one above the watermark");
    old.admit("job-output", &again, Check::Token)
        .expect("admit epoch 3");
    drop(old);
    pair.primary
        .kill_postmaster()
        .expect("the old primary dies");
    pair.standby
        .restart()
        .expect("the standby comes back, still a standby");
    pair.standby.promote().expect("promote the standby");

    let mut new = pair.standby_conn();
    assert!(new.inspect("job").expect("inspect").is_none());
    assert_eq!(
        query_lines(
            &mut new,
            "SELECT pruned_through::text AS line FROM lease.lineage"
        ),
        vec!["2".to_owned()],
        "the watermark replicated"
    );
    let winner = grant(&mut new, "job", "new-a");
    assert_eq!(
        winner.epoch(),
        GENERATION_1,
        "above 3 and above the watermark"
    );
    for old_token in [first.token(), again.token()] {
        match new.admit("job-output", &old_token, Check::Token) {
            Err(e)
                if e.kind() == ErrorKind::Fenced
                    && matches!(e.refusal(), Some(Refusal::StaleEpoch { .. })) =>
            {
                assert_eq!(
                    e.refusal(),
                    Some(Refusal::StaleEpoch {
                        accepted: leasehold::Epoch::new(GENERATION_1)
                    })
                )
            }
            other => panic!(
                "old epoch {} after the promotion: {other:?}",
                old_token.epoch()
            ),
        }
    }
    new.admit("job-output", &winner, Check::Token)
        .expect("admit the new holder");
}

/// docs/SPECIFICATION.md §2.1 across a promotion: the fence is replicated
/// with its table, a grant the promoted server never saw fences nothing
/// there, and the promoted server's own grant (above every old epoch)
/// writes.
#[test]
fn a_fenced_table_after_a_promotion_admits_only_the_promoted_servers_grants() {
    use diesel::connection::SimpleConnection;

    let pair = ReplicatedPair::start(false);
    let mut old = pair.primary_conn();
    old.batch_execute("CREATE TABLE ledger (entry text)")
        .expect("create the table");
    old.protect_table("ledger", "ledger-writer")
        .expect("fence the table");
    let write = |conn: &mut PgConnection, lease: Option<&Lease>, entry: &str| {
        conn.transaction(|conn| {
            if let Some(lease) = lease {
                conn.present(lease).expect("present");
            }
            conn.batch_execute(&format!("INSERT INTO ledger VALUES ('{entry}')"))
        })
        .map_err(LeaseError::from)
    };
    let first = grant(&mut old, "ledger-writer", "w1");
    write(&mut old, Some(&first), "w1").expect("the holder writes");
    release_ok(&mut old, &first);
    pair.wait_caught_up();

    // Cut off: the old primary grants again and writes; nobody sees it.
    pair.standby.stop(StopMode::Fast).expect("stop the standby");
    let lost = grant(&mut old, "ledger-writer", "w2");
    write(&mut old, Some(&lost), "w2 lost").expect("the old primary admits its holder");
    drop(old);
    pair.primary
        .kill_postmaster()
        .expect("the old primary dies");
    pair.standby.restart().expect("the standby comes back");
    pair.standby.promote().expect("promote the standby");

    let mut new = pair.standby_conn();
    assert_eq!(new.fenced_tables().expect("list").len(), 1);
    for (lease, who) in [
        (None, "no token"),
        (Some(&first), "released"),
        (Some(&lost), "never granted here"),
    ] {
        match write(&mut new, lease, who) {
            // A fenced table's refusal of a write (not of its owner).
            Err(e) if e.table().is_some() && e.role().is_none() => assert!(
                match lease {
                    // NoToken
                    None => {
                        e.kind() == ErrorKind::Forbidden && e.refusal() == Some(Refusal::NoToken)
                    }
                    // NotHeld
                    Some(_) => e.kind() == ErrorKind::Fenced && e.owner().is_some(),
                },
                "{who}: {:?}",
                e.refusal()
            ),
            other => panic!("{who}: {other:?}"),
        }
    }
    let winner = grant(&mut new, "ledger-writer", "w3");
    assert!(winner.epoch() > lost.epoch());
    write(&mut new, Some(&winner), "w3").expect("the promoted server's holder writes");
    assert_eq!(
        query_lines(
            &mut new,
            "SELECT string_agg(entry, ',' ORDER BY entry) AS line FROM ledger"
        ),
        vec!["w1,w3".to_owned()]
    );
}
