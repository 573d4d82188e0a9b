//! pg_lease's quick start and examples 1–5 (docs/SPECIFICATION.md), run as
//! SQL, unchanged except where noted, giving the results pg_lease documents.

use diesel::connection::SimpleConnection;

use crate::common::*;

#[test]
fn pg_lease_quick_start_gives_its_documented_results() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let acquired = query_lines(
        &mut conn,
        "SELECT format('%s|%s|%s', acquired, epoch, expires_at > clock_timestamp() + interval '29s') AS line \
         FROM lease.acquire('job-42', 'worker-a1', interval '30s')",
    );
    assert_eq!(acquired, ["t|1|t"]);
    let renewed = query_lines(
        &mut conn,
        "SELECT format('%s|%s', status, expires_at IS NOT NULL) AS line FROM lease.renew('job-42', 'worker-a1', 1, interval '30s')",
    );
    assert_eq!(renewed, ["ok|t"]);
    let released = query_lines(
        &mut conn,
        "SELECT status AS line FROM lease.release('job-42', 'worker-a1', 1)",
    );
    assert_eq!(released, ["ok"]);
    let observed = query_lines(
        &mut conn,
        "SELECT format('%s|%s|%s|%s', held, owner, epoch, expires_at) AS line FROM lease.inspect('job-42')",
    );
    assert_eq!(observed, ["f||2|"]);
}

#[test]
fn pg_lease_example_1_duplicate_acquire_returns_the_same_epoch() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sql = "SELECT format('%s|%s', acquired, epoch) AS line FROM lease.acquire('job-42', 'worker-a1', interval '30s')";
    assert_eq!(query_lines(&mut conn, sql), ["t|1"]);
    assert_eq!(query_lines(&mut conn, sql), ["t|1"]);
}

/// Examples 2 and 3 verbatim, with pg_lease's 10 s ttl: b2 blocks until a1's
/// grant lapses, takes over with epoch 2, and a1's renew says `lapsed`.
/// Then examples 4 and 5.
#[test]
fn pg_lease_examples_2_to_5_takeover_fencing_watermark_and_independent_keys() {
    let db = TestDb::new();
    let mut conn = db.conn();
    assert_eq!(
        query_lines(&mut conn, "SELECT format('%s|%s', acquired, epoch) AS line FROM lease.acquire('job-42', 'worker-a1', interval '10s')"),
        ["t|1"]
    );
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT format('%s|%s', acquired, epoch) AS line FROM lease.acquire('job-42', 'worker-b2', interval '30s', interval '15s')"
        ),
        ["t|2"]
    );
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT status AS line FROM lease.renew('job-42', 'worker-a1', 1, interval '30s')"
        ),
        ["lapsed"]
    );
    // Example 4: inspect as a fencing watermark.
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT format('%s|%s|%s', held, owner, epoch) AS line FROM lease.inspect('job-42')"
        ),
        ["t|worker-b2|2"]
    );
    conn.batch_execute("SELECT * FROM lease.release('job-42', 'worker-b2', 2)")
        .unwrap();
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT format('%s|%s|%s', held, owner, epoch) AS line FROM lease.inspect('job-42')"
        ),
        ["f||3"]
    );
    // Example 5: distinct keys never interact.
    assert_eq!(
        query_lines(&mut conn, "SELECT acquired::text AS line FROM lease.acquire('job-43', 'worker-a1', interval '30s')"),
        ["true"]
    );
}
