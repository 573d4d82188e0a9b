//! Fenced tables survive what tables survive (docs/SPECIFICATION.md §2.1):
//! a dump restored as the owner or with `--no-owner`, from a migrations
//! install and from the extension, keeps each fence (its triggers and
//! their arguments), and the restored table still refuses a write without
//! the key's live grant and admits one with it.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold::admin::Operator;
use leasehold::error::LeaseError;
use leasehold::guard::{Fencing, TableFence};
use leasehold::Leases;
use leasehold::{ErrorKind, Refusal};

use super::privileges::{install_as_app, pg_restore, Restore};
use super::{app_conn, conn, database, pg_dump_file, rows};

#[test]
fn pg_dump_a_fenced_table_restored_stays_fenced() {
    for use_extension in [false, true] {
        let db = database();
        let mut app = install_as_app(&db, use_extension);
        app.batch_execute("CREATE SCHEMA books; CREATE TABLE books.ledger (entry text)")
            .unwrap();
        app.protect_table("books.ledger", "ledger-writer").unwrap();
        let lease = match app
            .acquire("ledger-writer", "w1", std::time::Duration::from_secs(3600))
            .unwrap()
        {
            leasehold::Acquisition::Granted(lease) => lease,
            other => panic!("{other:?}"),
        };
        app.transaction(|conn| {
            conn.present(&lease).unwrap();
            conn.batch_execute("INSERT INTO books.ledger VALUES ('before the dump')")
        })
        .unwrap();
        let file = pg_dump_file(&db);
        let restores: &[Restore] = if use_extension {
            &[Restore::AsOwner, Restore::NoOwner]
        } else {
            &[Restore::AsOwner, Restore::NoOwner, Restore::Plain]
        };
        for &how in restores {
            let restored = pg_restore(&file, how, false);
            // The owner of the restored table writes: app, or the superuser
            // for --no-owner.
            let mut writer = match how {
                Restore::NoOwner => conn(&restored),
                _ => app_conn(&restored),
            };
            let fenced = writer.fenced_tables().unwrap();
            assert_eq!(fenced.len(), 1, "{how:?}: {fenced:?}");
            assert_eq!(
                fenced[0].fence,
                TableFence::Table {
                    key: "ledger-writer".to_owned()
                },
                "{how:?}"
            );
            let refused = writer
                .batch_execute("INSERT INTO books.ledger VALUES ('no token')")
                .unwrap_err();
            assert!(
                {
                    let error = LeaseError::from(refused);
                    error.kind() == ErrorKind::Forbidden
                        && error.refusal() == Some(Refusal::NoToken)
                        && error.table().is_some()
                },
                "extension={use_extension} {how:?}"
            );
            writer
                .transaction(|conn| {
                    conn.present(&lease).unwrap();
                    conn.batch_execute("INSERT INTO books.ledger VALUES ('after the restore')")
                })
                .unwrap_or_else(|e| panic!("extension={use_extension} {how:?}: {e}"));
            assert_eq!(
                rows(
                    &mut writer,
                    "SELECT string_agg(entry, ',' ORDER BY entry) AS t FROM books.ledger"
                ),
                ["after the restore,before the dump"],
                "extension={use_extension} {how:?}"
            );
        }
    }
}
