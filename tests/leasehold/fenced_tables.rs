//! Fenced tables (docs/SPECIFICATION.md §2.1): the table refuses a write
//! from a transaction that did not present the live grant of its key,
//! whatever statement or client sends it. A deployment of non-superuser
//! roles: the database owner owns the tables and fences them; the
//! application and the attacker have every table privilege, so only the
//! fence stands between them and the rows.

use std::process::Command;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold::admin::Operator;
use leasehold::error::Operation;
use leasehold::guard::{Check, Fencing, TableFence};
use leasehold::{ErrorKind, FencingToken, LeaseClient, LeaseError, Leases, Refusal};
use leasehold_test_support::Deployment;

use crate::common::*;

/// A deployment whose owner made `jobs` (fenced by key `jobs-leader`) and
/// `items` (each row fenced by `tenant/<tenant>`), every privilege on both
/// granted to the application and the attacker.
pub(crate) fn fenced() -> Deployment {
    let d = Deployment::new();
    let mut owner = d.conn_as(&d.owner);
    owner
        .batch_execute(&format!(
            "CREATE TABLE public.jobs (id int PRIMARY KEY, state text NOT NULL);
             CREATE TABLE public.items (tenant int NOT NULL, id int NOT NULL, body text, PRIMARY KEY (tenant, id));
             GRANT ALL ON public.jobs, public.items TO {app}, {worker}, {attacker};",
            app = d.app,
            worker = d.worker,
            attacker = d.attacker
        ))
        .unwrap();
    owner.protect_table("public.jobs", "jobs-leader").unwrap();
    owner
        .protect_rows("public.items", "tenant/", &["tenant"])
        .unwrap();
    d
}

/// What a refused write reads as: a fenced table's refusal of the statement.
pub(crate) fn refusal(error: impl Into<LeaseError>) -> LeaseError {
    let error = error.into();
    if error.table().is_none() || error.operation() != Some(Operation::STATEMENT) {
        panic!("expected a fenced table's refusal, got {error:?}");
    }
    error
}

/// Whether a table's refusal is that no token of its key was presented;
/// `key()` names the key.
pub(crate) fn is_no_token(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Forbidden && error.refusal() == Some(Refusal::NoToken)
}

/// Whether a table's refusal is that the presented token is not the key's
/// live grant; `key()`, `owner()` and `epoch()` name it, `refusal()` says
/// what happened to it when the server said.
pub(crate) fn is_not_held(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Fenced && error.table().is_some()
}

/// The database's own error under `error`, if it is one leasehold has no
/// kind for (what was `LeaseError::Database`).
fn database_error(error: &LeaseError) -> Option<&diesel::result::Error> {
    if error.kind() != ErrorKind::Other {
        return None;
    }
    std::error::Error::source(error)?.downcast_ref()
}

pub(crate) fn rows(conn: &mut PgConnection, sql: &str) -> Vec<String> {
    query_lines(
        conn,
        &format!(
            "SELECT COALESCE(string_agg(x::text, ',' ORDER BY x), '') AS line FROM ({sql}) AS x"
        ),
    )
    .into_iter()
    .filter(|line| !line.is_empty())
    .collect()
}

/// Runs `writes` in one transaction that first presents `token` (if any),
/// committing when they all succeed.
pub(crate) fn write(
    conn: &mut PgConnection,
    token: Option<&FencingToken>,
    writes: &str,
) -> Result<(), LeaseError> {
    conn.transaction(|conn| {
        if let Some(token) = token {
            conn.present(token)
                .map_err(|error| match database_error(&error) {
                    Some(_) => error,
                    None => panic!("present: {error}"),
                })?;
        }
        conn.batch_execute(writes)?;
        Ok(())
    })
}

#[test]
fn every_kind_of_write_needs_the_live_token_of_the_tables_key() {
    let d = fenced();
    let mut app = d.conn_as(&d.app);
    let lease = granted(app.acquire("jobs-leader", "w1", TTL).unwrap());
    let mut writes = vec![
        "INSERT INTO jobs VALUES (1, 'new')",
        "INSERT INTO jobs VALUES (1, 'again') ON CONFLICT (id) DO UPDATE SET state = excluded.state",
        "UPDATE jobs SET state = 'running' WHERE id = 1",
        "DELETE FROM jobs WHERE id = 1",
        "INSERT INTO jobs VALUES (2, 'kept')",
        "TRUNCATE jobs",
        "INSERT INTO jobs VALUES (3, 'kept')",
    ];
    if query_bool(
        &mut app,
        "SELECT current_setting('server_version_num')::int >= 150000 AS flag",
    ) {
        writes.push(
            "MERGE INTO jobs j USING (VALUES (3, 'merged')) AS s(id, state) ON j.id = s.id \
             WHEN MATCHED THEN UPDATE SET state = s.state",
        );
    }
    for sql in &writes {
        let before = rows(&mut app, "SELECT * FROM jobs");
        assert!(
            matches!(refusal(write(&mut app, None, sql).unwrap_err()), ref e if is_no_token(e) && e.key() == Some("jobs-leader")),
            "{sql}"
        );
        assert_eq!(
            rows(&mut app, "SELECT * FROM jobs"),
            before,
            "{sql}: nothing of a refused write is visible"
        );
        write(&mut app, Some(lease.token()), sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let expected = if writes.len() == 8 {
        "(3,merged)"
    } else {
        "(3,kept)"
    };
    assert_eq!(
        rows(&mut app, "SELECT * FROM jobs"),
        vec![expected.to_owned()]
    );
}

#[test]
fn a_superseded_holder_is_refused_before_its_successor_writes() {
    let d = fenced();
    let mut old = d.conn_as(&d.app);
    let mut new = d.conn_as(&d.app);
    let first = granted(
        old.acquire("jobs-leader", "w1", STILL_HELD_NEXT_STEP)
            .unwrap(),
    );
    write(
        &mut old,
        Some(first.token()),
        "INSERT INTO jobs VALUES (1, 'by w1')",
    )
    .unwrap();
    // w1 pauses past its ttl; w2 takes the key over and has not written.
    wait_until_server_time_passes(&mut new, first.expires_at());
    let second = granted(new.acquire("jobs-leader", "w2", TTL).unwrap());
    match refusal(
        write(
            &mut old,
            Some(first.token()),
            "UPDATE jobs SET state = 'late'",
        )
        .unwrap_err(),
    ) {
        error if is_not_held(&error) => {
            assert_eq!(
                (error.key(), error.owner(), error.epoch()),
                (Some("jobs-leader"), Some("w1"), Some(first.epoch()))
            );
            let reason = error.refusal();
            assert!(
                matches!(
                    reason,
                    Some(Refusal::Lapsed { .. }) | Some(Refusal::Superseded { .. })
                ),
                "{reason:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rows(&mut new, "SELECT state FROM jobs"),
        vec!["(\"by w1\")".to_owned()]
    );
    write(
        &mut new,
        Some(second.token()),
        "UPDATE jobs SET state = 'by w2'",
    )
    .unwrap();
    // A released lease fences nothing any more either.
    let _ = new.release(&second).unwrap();
    assert!(matches!(
        refusal(write(&mut new, Some(second.token()), "DELETE FROM jobs").unwrap_err()),
        ref e if is_not_held(e)
    ));
}

#[test]
fn a_checked_write_holds_off_the_takeover_until_it_commits() {
    let d = fenced();
    let mut holder = d.conn_as(&d.app);
    let mut rival = d.conn_as(&d.worker);
    let lease = granted(
        holder
            .acquire("jobs-leader", "w1", STILL_HELD_NEXT_STEP)
            .unwrap(),
    );
    holder.batch_execute("BEGIN").unwrap();
    holder.present(&lease).unwrap();
    holder
        .batch_execute("INSERT INTO jobs VALUES (1, 'w1')")
        .unwrap();
    wait_until_server_time_passes(&mut rival, lease.expires_at());
    // The lease lapsed, but the checked write is still open: a takeover
    // waits for it (G6), then succeeds.
    let url = d.url_as(&d.worker);
    let takeover = std::thread::spawn(move || {
        let mut rival = PgConnection::establish(&url).unwrap();
        rival.acquire("jobs-leader", "w2", TTL).unwrap()
    });
    let observer_sql = "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%lease.acquire%') AS flag";
    let mut observer = d.admin();
    let mut waited = false;
    for _ in 0..4_000 {
        if query_bool(&mut observer, observer_sql) {
            waited = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(waited, "the takeover did not wait for the checked write");
    holder.batch_execute("COMMIT").unwrap();
    assert!(granted(takeover.join().unwrap()).epoch() > lease.epoch());
    assert_eq!(
        rows(&mut rival, "SELECT state FROM jobs"),
        vec!["(w1)".to_owned()]
    );
}

#[test]
fn a_token_authorises_only_its_own_transaction() {
    let d = fenced();
    let mut app = d.conn_as(&d.app);
    let lease = granted(app.acquire("jobs-leader", "w1", TTL).unwrap());
    let token = lease.token();
    // Presented in an earlier transaction of the same session.
    write(&mut app, Some(token), "INSERT INTO jobs VALUES (1, 'a')").unwrap();
    assert!(matches!(
        refusal(write(&mut app, None, "INSERT INTO jobs VALUES (2, 'b')").unwrap_err()),
        ref e if is_no_token(e)
    ));
    // Presented in a savepoint that rolled back.
    let rolled_back = app.transaction(|conn| {
        conn.batch_execute("SAVEPOINT s").unwrap();
        conn.present(token).unwrap();
        conn.batch_execute("ROLLBACK TO SAVEPOINT s; INSERT INTO jobs VALUES (3, 'c')")
    });
    assert!(matches!(
        refusal(rolled_back.unwrap_err()),
        ref e if is_no_token(e)
    ));
    // The setting made by hand at session level, as a previous user of a
    // pooled connection could leave it, names an earlier transaction.
    app.batch_execute("BEGIN").unwrap();
    app.present(token).unwrap();
    let claims = query_lines(
        &mut app,
        "SELECT current_setting('lease.presented') AS line",
    )
    .remove(0);
    app.batch_execute("COMMIT").unwrap();
    app.batch_execute(&format!("SET lease.presented = {}", quote(&claims)))
        .unwrap();
    assert!(matches!(
        refusal(write(&mut app, None, "INSERT INTO jobs VALUES (4, 'd')").unwrap_err()),
        ref e if is_no_token(e)
    ));
    // A claim forged for this very transaction but naming a stale grant.
    app.batch_execute("RESET lease.presented").unwrap();
    let _ = app.release(&lease).unwrap();
    let forged = app.transaction(|conn| {
        conn.batch_execute(
            "SELECT set_config('lease.presented', pg_current_xact_id()::text || ' 11:jobs-leader:2:w1:1;', true)",
        )?;
        conn.batch_execute("INSERT INTO jobs VALUES (5, 'e')")
    });
    assert!(matches!(
        refusal(forged.unwrap_err()),
        ref e if is_not_held(e)
    ));
    // A token of another key.
    let other = granted(app.acquire("other-key", "w1", TTL).unwrap());
    assert!(matches!(
        refusal(
            write(
                &mut app,
                Some(other.token()),
                "INSERT INTO jobs VALUES (6, 'f')"
            )
            .unwrap_err()
        ),
        ref e if is_no_token(e)
    ));
    assert_eq!(
        rows(&mut app, "SELECT id FROM jobs"),
        vec!["(1)".to_owned()]
    );
}

#[test]
fn nobody_but_the_owner_lifts_the_fence_and_side_doors_stay_fenced() {
    let d = fenced();
    let mut attacker = d.conn_as(&d.attacker);
    // Another role's table: neither fence it nor unfence it.
    for result in [
        attacker.unprotect_table("public.jobs").map(drop),
        attacker.protect_table("public.jobs", "mine"),
        attacker.protect_rows("public.items", "", &["id"]),
    ] {
        assert!(
            matches!(result, Err(ref e) if e.kind() == ErrorKind::Forbidden && e.table().is_some() && e.role().is_some()),
            "{result:?}"
        );
    }
    for sql in [
        "ALTER TABLE jobs DISABLE TRIGGER lease_fence",
        "ALTER TABLE jobs DISABLE TRIGGER ALL",
        "DROP TRIGGER lease_fence ON jobs",
        "SET session_replication_role = replica",
    ] {
        assert!(attacker.batch_execute(sql).is_err(), "{sql}");
    }
    // A superuser in replica mode still meets the fence (enabled ALWAYS).
    let mut admin = d.admin();
    let replica = admin
        .batch_execute("SET session_replication_role = replica; INSERT INTO jobs VALUES (1, 'r')");
    assert!(matches!(
        refusal(replica.unwrap_err()),
        ref e if is_no_token(e)
    ));
    admin
        .batch_execute("RESET session_replication_role")
        .unwrap();
    // Writes through the owner's view and SECURITY DEFINER function, and
    // from a deferred trigger firing at COMMIT, are fenced like any other.
    let mut owner = d.conn_as(&d.owner);
    owner
        .batch_execute(&format!(
            "CREATE VIEW jobs_view AS SELECT * FROM jobs;
             CREATE FUNCTION add_job(i int) RETURNS void LANGUAGE sql SECURITY DEFINER
                 AS $$ INSERT INTO public.jobs VALUES (i, 'via function') $$;
             CREATE TABLE public.events (id int);
             CREATE FUNCTION copy_event() RETURNS trigger LANGUAGE plpgsql
                 AS $$ BEGIN INSERT INTO public.jobs VALUES (NEW.id, 'deferred'); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER later AFTER INSERT ON public.events DEFERRABLE INITIALLY DEFERRED
                 FOR EACH ROW EXECUTE FUNCTION copy_event();
             GRANT ALL ON jobs_view, public.events TO {attacker};
             GRANT EXECUTE ON FUNCTION add_job(int) TO {attacker};",
            attacker = d.attacker
        ))
        .unwrap();
    for sql in [
        "INSERT INTO jobs_view VALUES (2, 'via view')",
        "SELECT add_job(3)",
        "INSERT INTO events VALUES (4)",
        "BEGIN; SET CONSTRAINTS ALL DEFERRED; INSERT INTO events VALUES (5); COMMIT",
    ] {
        let error = attacker.batch_execute(sql).unwrap_err();
        assert!(matches!(refusal(error), ref e if is_no_token(e)), "{sql}");
        let _ = attacker.batch_execute("ROLLBACK");
    }
    assert!(rows(&mut admin, "SELECT id FROM jobs").is_empty());
    // The owner lifts the fence; the table is an ordinary table again.
    assert!(owner.unprotect_table("public.jobs").unwrap());
    assert!(!owner.unprotect_table("public.jobs").unwrap());
    attacker
        .batch_execute("INSERT INTO jobs VALUES (9, 'free')")
        .unwrap();
}

#[test]
fn a_row_fence_needs_the_token_of_every_key_a_statement_touches() {
    let d = fenced();
    let mut app = d.conn_as(&d.app);
    let seven = granted(app.acquire("tenant/7", "w1", TTL).unwrap());
    let eight = granted(app.acquire("tenant/8", "w1", TTL).unwrap());
    write(
        &mut app,
        Some(seven.token()),
        "INSERT INTO items VALUES (7, 1, 'a'), (7, 2, 'b')",
    )
    .unwrap();
    let refused = write(
        &mut app,
        Some(seven.token()),
        "INSERT INTO items VALUES (7, 3, 'c'), (8, 1, 'x')",
    );
    assert!(
        matches!(refusal(refused.unwrap_err()), ref e if is_no_token(e) && e.key() == Some("tenant/8"))
    );
    // Moving a row to another key needs both keys' tokens.
    let moved = write(
        &mut app,
        Some(seven.token()),
        "UPDATE items SET tenant = 8 WHERE id = 2",
    );
    assert!(
        matches!(refusal(moved.unwrap_err()), ref e if is_no_token(e) && e.key() == Some("tenant/8"))
    );
    app.transaction(|conn| {
        conn.present(&seven).unwrap();
        conn.present(&eight).unwrap();
        conn.batch_execute("UPDATE items SET tenant = 8 WHERE id = 2")
    })
    .unwrap();
    // The row's old key is checked too: tenant 8's token alone cannot
    // take a row from tenant 7.
    let taken = write(
        &mut app,
        Some(eight.token()),
        "UPDATE items SET tenant = 8 WHERE id = 1",
    );
    assert!(
        matches!(refusal(taken.unwrap_err()), ref e if is_no_token(e) && e.key() == Some("tenant/7"))
    );
    assert!(matches!(
        refusal(write(&mut app, Some(seven.token()), "TRUNCATE items").unwrap_err()),
        ref e if e.kind() == ErrorKind::InvalidInput && e.refusal() == Some(Refusal::Truncate)
    ));
    // Writers of different keys do not wait for each other: tenant 7's
    // transaction stays open while tenant 8's commits.
    app.batch_execute("BEGIN").unwrap();
    app.present(&seven).unwrap();
    app.batch_execute("INSERT INTO items VALUES (7, 10, 'open')")
        .unwrap();
    let mut other = d.conn_as(&d.app);
    write(
        &mut other,
        Some(eight.token()),
        "INSERT INTO items VALUES (8, 10, 'meanwhile')",
    )
    .unwrap();
    app.batch_execute("COMMIT").unwrap();
    assert_eq!(
        rows(&mut app, "SELECT tenant, id FROM items"),
        vec!["(7,1),(7,10),(8,2),(8,10)".to_owned()]
    );
}

#[test]
fn protecting_checks_its_table_and_columns_and_lists_what_it_did() {
    let d = fenced();
    let mut owner = d.conn_as(&d.owner);
    owner
        .batch_execute(
            "CREATE TABLE public.parted (id int, at timestamptz) PARTITION BY RANGE (id);
             CREATE TABLE public.part1 PARTITION OF public.parted FOR VALUES FROM (0) TO (10);
             CREATE TABLE public.stamped (id int, at timestamptz);",
        )
        .unwrap();
    for result in [
        owner.protect_table("public.parted", "k"),
        owner.protect_table("public.part1", "k"),
        owner.protect_table("public.jobs", ""),
        owner.protect_rows("public.stamped", "s/", &["at"]),
        owner.protect_rows("public.stamped", "s/", &["missing"]),
        owner.protect_rows("public.stamped", "s/", &[]),
        owner.protect_table("public.no_such_table", "k"),
    ] {
        assert!(
            matches!(result, Err(ref e) if e.kind() == leasehold::ErrorKind::InvalidInput)
                || matches!(result, Err(ref e) if database_error(e).is_some()),
            "{result:?}"
        );
    }
    let fenced = owner.fenced_tables().unwrap();
    assert_eq!(fenced.len(), 2, "{fenced:?}");
    assert_eq!(fenced[0].table, "public.items");
    assert_eq!(
        fenced[0].fence,
        TableFence::Rows {
            key_prefix: "tenant/".to_owned(),
            key_columns: vec!["tenant".to_owned()]
        }
    );
    assert_eq!(fenced[1].table, "public.jobs");
    assert_eq!(
        fenced[1].fence,
        TableFence::Table {
            key: "jobs-leader".to_owned()
        }
    );
}

#[test]
fn run_fenced_presents_its_token_and_a_pooled_session_keeps_nothing() {
    let d = fenced();
    let mut client = LeaseClient::connect(&d.url_as(&d.app), 1).unwrap();
    let lease = granted(client.acquire("jobs-leader", "w1", TTL).unwrap());
    client
        .run_fenced("jobs-resource", &lease, Check::LeaseHeld, |conn| {
            conn.batch_execute("INSERT INTO jobs VALUES (1, 'fenced')")
        })
        .unwrap();
    // The pool's only connection served that transaction; the next
    // transaction on the same session presents nothing.
    let mut pooled = client.pool().get().unwrap();
    assert!(matches!(
        refusal(
            pooled
                .batch_execute("INSERT INTO jobs VALUES (2, 'unfenced')")
                .unwrap_err()
        ),
        ref e if is_no_token(e)
    ));
    drop(pooled);
    assert_eq!(
        rows(&mut d.conn_as(&d.app), "SELECT id FROM jobs"),
        vec!["(1)".to_owned()]
    );
}

/// psql, the client that ignores the library: one SQL call presents the
/// token; COPY FROM is fenced like INSERT.
#[test]
fn psql_presents_with_one_call_and_copy_is_fenced() {
    let d = fenced();
    let mut app = d.conn_as(&d.app);
    let lease = granted(app.acquire("jobs-leader", "w1", TTL).unwrap());
    let psql = |script: &str| {
        let bin =
            d.db.server()
                .local_postgres()
                .map(|pg| pg.bin_dir().join("psql"))
                .filter(|path| path.exists())
                .unwrap_or_else(|| "psql".into());
        Command::new(bin)
            .args([
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                &d.url_as(&d.app),
                "-c",
                script,
            ])
            .output()
            .expect("run psql")
    };
    let refused = psql("BEGIN; COPY jobs FROM STDIN; COMMIT;");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("lease.present"));
    let present = format!(
        "BEGIN; SELECT lease.present('jobs-leader', 'w1', {}); INSERT INTO jobs VALUES (1, 'psql'); COMMIT;",
        lease.epoch()
    );
    let admitted = psql(&present);
    assert!(
        admitted.status.success(),
        "{}",
        String::from_utf8_lossy(&admitted.stderr)
    );
    let stale = psql(&format!(
        "BEGIN; SELECT lease.present('jobs-leader', 'w1', {}); DELETE FROM jobs; COMMIT;",
        lease.epoch().get() + 1
    ));
    assert!(!stale.status.success());
    assert!(
        String::from_utf8_lossy(&stale.stderr).contains("lease_guard_lease_not_held")
            || String::from_utf8_lossy(&stale.stderr).contains("not held")
    );
    assert_eq!(
        rows(&mut app, "SELECT state FROM jobs"),
        vec!["(psql)".to_owned()]
    );
}

#[test]
fn a_pruned_key_fences_every_write_until_granted_again() {
    let d = fenced();
    let mut app = d.conn_as(&d.app);
    let lease = granted(app.acquire("jobs-leader", "w1", TTL).unwrap());
    let _ = app.release(&lease).unwrap();
    // A FREE key is sighted by one pass and pruned by a later one.
    let prune = || {
        d.admin()
            .prune(&leasehold::admin::PruneOptions::new(Duration::from_micros(
                1,
            )))
            .unwrap()
    };
    let sighted = prune();
    assert_eq!(sighted.keys_sighted, 1, "{sighted:?}");
    let pruned = prune();
    assert_eq!(pruned.keys_pruned, 1, "{pruned:?}");
    assert!(matches!(
        refusal(
            write(
                &mut app,
                Some(lease.token()),
                "INSERT INTO jobs VALUES (1, 'x')"
            )
            .unwrap_err()
        ),
        ref e if is_not_held(e)
    ));
    let again = granted(app.acquire("jobs-leader", "w1", TTL).unwrap());
    write(
        &mut app,
        Some(again.token()),
        "INSERT INTO jobs VALUES (1, 'x')",
    )
    .unwrap();
}

/// The steps every client test takes, in order, on table `ledger` fenced
/// by `ledger-writer`: no token (refused), the holder's token (admitted),
/// then the holder pauses past its ttl, a successor is granted and has not
/// written, and the paused holder's write is refused; the successor's is
/// admitted. `write(owner_and_epoch, value)` is the client's write; it
/// answers "admitted" or "refused <constraint>".
fn client_story(d: &Deployment, mut write: impl FnMut(Option<(&str, i64)>, &str) -> String) {
    let mut owner = d.conn_as(&d.owner);
    owner
        .batch_execute(&format!(
            "CREATE TABLE public.ledger (entry text); GRANT ALL ON public.ledger TO {}",
            d.app
        ))
        .unwrap();
    owner
        .protect_table("public.ledger", "ledger-writer")
        .unwrap();
    let mut app = d.conn_as(&d.app);
    let first = granted(
        app.acquire("ledger-writer", "w1", STILL_HELD_NEXT_STEP)
            .unwrap(),
    );
    let e1 = first.epoch().get();
    assert_eq!(write(None, "none"), "refused lease_fence_no_token");
    assert_eq!(write(Some(("w1", e1)), "current"), "admitted");
    wait_until_server_time_passes(&mut app, first.expires_at());
    let second = granted(app.acquire("ledger-writer", "w2", TTL).unwrap());
    assert_eq!(
        write(Some(("w1", e1)), "paused holder"),
        "refused lease_guard_lease_not_held"
    );
    assert_eq!(
        write(Some(("w2", second.epoch().get())), "successor"),
        "admitted"
    );
    assert_eq!(
        rows(&mut app, "SELECT entry FROM ledger"),
        vec!["(current),(successor)".to_owned()]
    );
}

/// Python with psycopg, from the virtual environment `cargo xtask setup`
/// makes under the target directory (or the system's, if it has psycopg).
#[test]
fn a_python_psycopg_writer_is_fenced_like_any_other() {
    let d = Deployment::new();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|exe| exe.ancestors().nth(3).map(|dir| dir.to_path_buf()))
        })
        .expect("the target directory");
    let venv_python = target.join("xtask-moto/bin/python3");
    let python = if venv_python.exists() {
        venv_python
    } else {
        "python3".into()
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/fenced_write.py");
    let url = d.url_as(&d.app);
    client_story(&d, |token, value| {
        let (owner, epoch) = token.map_or(("-".to_owned(), "none".to_owned()), |(o, e)| {
            (o.to_owned(), e.to_string())
        });
        let output = Command::new(&python)
            .args([
                script,
                &url,
                "ledger",
                "ledger-writer",
                &owner,
                &epoch,
                value,
            ])
            .output()
            .expect("run python3");
        assert!(
            output.status.success(),
            "the Python client failed (psycopg missing? `cargo xtask setup` installs it): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    });
}

/// tokio-postgres, which knows nothing of diesel or leasehold.
#[test]
fn a_tokio_postgres_writer_is_fenced_like_any_other() {
    let d = Deployment::new();
    let url = d.url_as(&d.app);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
    });
    let mut client = client;
    client_story(&d, |token, value| {
        runtime.block_on(async {
            let transaction = client.transaction().await.unwrap();
            if let Some((owner, epoch)) = token {
                transaction
                    .execute(
                        "SELECT lease.present('ledger-writer', $1, $2)",
                        &[&owner, &epoch],
                    )
                    .await
                    .unwrap();
            }
            let written = transaction
                .execute("INSERT INTO ledger VALUES ($1)", &[&value])
                .await;
            match written {
                Ok(_) => {
                    transaction.commit().await.unwrap();
                    "admitted".to_owned()
                }
                Err(error) => {
                    let constraint = error
                        .as_db_error()
                        .and_then(|db| db.constraint())
                        .unwrap_or_else(|| panic!("not a fence's refusal: {error}"));
                    format!("refused {constraint}")
                }
            }
        })
    });
}

/// The async face behind deadpool: `run_fenced` presents its token, and
/// the pool's next transaction on the same connection presents nothing.
#[cfg(feature = "async")]
#[test]
fn async_run_fenced_presents_its_token_and_a_deadpool_connection_keeps_nothing() {
    use leasehold::aio::{AsyncFencing, AsyncLeaseClient, AsyncLeases};

    let d = fenced();
    let url = d.url_as(&d.app);
    crate::aio_common::runtime().block_on(async {
        let mut client = AsyncLeaseClient::builder(&url)
            .max_size(1)
            .build()
            .await
            .unwrap();
        let lease = client
            .acquire("jobs-leader", "w1", TTL)
            .await
            .unwrap()
            .granted()
            .unwrap();
        client
            .run_fenced("jobs-resource", &lease, Check::LeaseHeld, async |conn| {
                diesel_async::RunQueryDsl::execute(
                    diesel::sql_query("INSERT INTO jobs VALUES (1, 'async')"),
                    conn,
                )
                .await
                .map(drop)
            })
            .await
            .unwrap();
        let mut pooled = client.pool().get().await.unwrap();
        let refused = diesel_async::RunQueryDsl::execute(
            diesel::sql_query("INSERT INTO jobs VALUES (2, 'unfenced')"),
            &mut *pooled,
        )
        .await
        .unwrap_err();
        assert!(matches!(refusal(refused), ref e if is_no_token(e)));
    });
    assert_eq!(
        rows(&mut d.conn_as(&d.app), "SELECT id FROM jobs"),
        vec!["(1)".to_owned()]
    );
}

/// A savepoint rolled back after the check gives its lock back, so a
/// takeover may then commit; the transaction's next write is checked again
/// and refused (the check is made at every write statement).
#[test]
fn a_check_rolled_back_with_its_savepoint_is_made_again_by_the_next_write() {
    let d = fenced();
    let mut holder = d.conn_as(&d.app);
    let mut rival = d.conn_as(&d.worker);
    let lease = granted(
        holder
            .acquire("jobs-leader", "w1", STILL_HELD_NEXT_STEP)
            .unwrap(),
    );
    holder.batch_execute("BEGIN").unwrap();
    holder.present(&lease).unwrap();
    holder
        .batch_execute(
            "SAVEPOINT s; INSERT INTO jobs VALUES (1, 'undone'); ROLLBACK TO SAVEPOINT s",
        )
        .unwrap();
    wait_until_server_time_passes(&mut rival, lease.expires_at());
    // Not held off: the check's lock went with the savepoint.
    let successor = granted(rival.acquire("jobs-leader", "w2", TTL).unwrap());
    let late = holder
        .batch_execute("INSERT INTO jobs VALUES (2, 'late')")
        .unwrap_err();
    assert!(matches!(refusal(late), ref e if is_not_held(e)));
    holder.batch_execute("ROLLBACK").unwrap();
    write(
        &mut rival,
        Some(successor.token()),
        "INSERT INTO jobs VALUES (3, 'w2')",
    )
    .unwrap();
    assert_eq!(
        rows(&mut rival, "SELECT id FROM jobs"),
        vec!["(3)".to_owned()]
    );
}

/// A fence as the first release made it (its triggers only, the
/// whole-table one calling `lease._fence('table', key)`) keeps fencing
/// after an upgrade; protecting it again with the same fence completes it.
#[test]
fn a_fence_made_by_an_earlier_version_keeps_working_until_protected_again() {
    let d = Deployment::new();
    let mut owner = d.conn_as(&d.owner);
    owner
        .batch_execute(&format!(
            "CREATE TABLE public.old_jobs (id int PRIMARY KEY);
             CREATE TABLE public.old_items (tenant int NOT NULL, id int NOT NULL);
             GRANT ALL ON public.old_jobs, public.old_items TO {app};
             CREATE TRIGGER lease_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON public.old_jobs
               FOR EACH STATEMENT EXECUTE FUNCTION lease._fence('table', 'old-leader');
             CREATE TRIGGER lease_fence_insert AFTER INSERT ON public.old_items REFERENCING NEW TABLE AS lease_new
               FOR EACH STATEMENT EXECUTE FUNCTION lease._fence('rows', 'old/', 'tenant');
             ALTER TABLE public.old_jobs ENABLE ALWAYS TRIGGER lease_fence;
             ALTER TABLE public.old_items ENABLE ALWAYS TRIGGER lease_fence_insert;",
            app = d.app
        ))
        .unwrap();
    let mut app = d.conn_as(&d.app);
    let leader = granted(app.acquire("old-leader", "w1", TTL).unwrap());
    let tenant = granted(app.acquire("old/1", "w1", TTL).unwrap());
    for (table, token, insert) in [
        (
            "old_jobs",
            leader.token(),
            "INSERT INTO old_jobs VALUES (1)",
        ),
        (
            "old_items",
            tenant.token(),
            "INSERT INTO old_items VALUES (1, 1)",
        ),
    ] {
        assert!(matches!(
            refusal(write(&mut app, None, insert).unwrap_err()),
            ref e if is_no_token(e)
        ));
        write(&mut app, Some(token), insert).unwrap_or_else(|error| panic!("{table}: {error}"));
    }
    // Not yet complete: the owner may still change a key column's type.
    owner
        .batch_execute("ALTER TABLE old_items ALTER COLUMN tenant TYPE bigint")
        .unwrap();
    owner
        .protect_table("public.old_jobs", "old-leader")
        .unwrap();
    owner
        .protect_rows("public.old_items", "old/", &["tenant"])
        .unwrap();
    assert!(owner
        .batch_execute("ALTER TABLE old_items ALTER COLUMN tenant TYPE int")
        .is_err());
    assert!(query_bool(
        &mut owner,
        "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'old_jobs'::regclass
                         AND tgfoid = 'lease._fence_table()'::regprocedure) AS flag"
    ));
    assert!(matches!(
        refusal(write(&mut app, None, "INSERT INTO old_jobs VALUES (2)").unwrap_err()),
        ref e if is_no_token(e)
    ));
    write(
        &mut app,
        Some(leader.token()),
        "INSERT INTO old_jobs VALUES (2)",
    )
    .unwrap();
}
