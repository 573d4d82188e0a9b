//! The one error type: every call returns `LeaseError`, and `kind()` says
//! what the caller does about it. Each kind is provoked here on a real
//! server through the call that produces it.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold::guard::{Check, Fencing};
use leasehold::hold::KeeperSet;
use leasehold::{ErrorKind, FencingToken, LeaseClient, LeaseError, Leases};

use crate::common::*;

fn kind<T: std::fmt::Debug>(result: Result<T, LeaseError>) -> (ErrorKind, String) {
    let error = result.expect_err("the call was to fail");
    let message = error.to_string();
    assert!(
        !message.contains('\n'),
        "a message is one line: {message:?}"
    );
    (error.kind(), message)
}

#[test]
fn each_kind_comes_from_the_failure_it_names() {
    let db = TestDb::new();
    let mut conn = db.conn();

    let (k, _) = kind(conn.acquire("", "o", TTL));
    assert_eq!(k, ErrorKind::InvalidInput);
    let (k, _) = kind("lh1.0.k.o".parse::<FencingToken>());
    assert_eq!(k, ErrorKind::InvalidInput);

    // A guard that a newer holder passed: the old holder is fenced.
    let first = granted(conn.acquire("kinds/a", "w1", TTL).unwrap());
    assert_eq!(conn.release(&first).unwrap(), leasehold::Release::Released);
    let second = granted(conn.acquire("kinds/a", "w2", TTL).unwrap());
    conn.admit("kinds/res", &second, Check::Token).unwrap();
    let (k, message) = kind(conn.admit("kinds/res", &first, Check::Token));
    assert_eq!(k, ErrorKind::Fenced, "{message}");
    assert!(message.contains("stop acting"), "{message}");
    let (k, _) = kind(conn.admit("kinds/res2", &first, Check::LeaseHeld));
    assert_eq!(k, ErrorKind::Fenced);

    // A keeper whose lease is gone fails to start, fenced too.
    let client = LeaseClient::connect(&db.url, 2).unwrap();
    let (k, _) = kind(KeeperSet::start(&client, vec![first.clone()]));
    assert_eq!(k, ErrorKind::Fenced);

    // A key whose row another transaction holds: the acquire times out.
    let mut blocker = db.conn();
    blocker
        .batch_execute("BEGIN; SELECT * FROM lease.acquire('kinds/b', 'x', interval '30 s')")
        .unwrap();
    let (k, message) = kind(conn.acquire("kinds/b", "y", TTL));
    assert_eq!(k, ErrorKind::TimedOut, "{message}");
    blocker.batch_execute("ROLLBACK").unwrap();

    // A read-only transaction: the server's role is wrong for a write.
    conn.batch_execute("BEGIN READ ONLY").unwrap();
    let (k, _) = kind(conn.acquire("kinds/c", "o", TTL));
    assert_eq!(k, ErrorKind::Unavailable);
    conn.batch_execute("ROLLBACK").unwrap();

    // A database without leasehold.
    let empty = TestDb::empty();
    let (k, message) = kind(empty.conn().acquire("k", "o", TTL));
    assert_eq!(k, ErrorKind::NotInstalled);
    assert!(message.contains("leasehold install"), "{message}");

    // A server nobody listens on.
    let (k, _) = kind(LeaseClient::connect(
        "postgres://nobody@127.0.0.1:1/none?connect_timeout=2",
        1,
    ));
    assert_eq!(k, ErrorKind::Unavailable);
}

/// `?` carries the caller's own diesel errors and leasehold's through one
/// transaction, and the transaction rolls back on either.
#[test]
fn a_transaction_mixes_its_statements_and_lease_calls_with_one_error_type() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute("CREATE TABLE kinds_log (line text NOT NULL)")
        .unwrap();
    let result: Result<(), LeaseError> = conn.transaction(|conn| {
        let lease = granted(conn.acquire("kinds/tx", "w", TTL)?);
        diesel::sql_query("INSERT INTO kinds_log VALUES ('acquired')").execute(conn)?;
        diesel::sql_query("INSERT INTO kinds_log VALUES (NULL)").execute(conn)?;
        let _released = conn.release(&lease)?;
        Ok(())
    });
    let error = result.unwrap_err();
    assert!(
        error.operation() == Some(leasehold::error::Operation::STATEMENT)
            && std::error::Error::source(&error)
                .is_some_and(|source| source.is::<diesel::result::Error>()),
        "{error:?}"
    );
    assert_eq!(error.kind(), ErrorKind::Other);
    assert!(conn.inspect("kinds/tx").unwrap().is_none(), "rolled back");
}
