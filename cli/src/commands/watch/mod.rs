//! `leasehold watch`: the keys of `ls`, refreshed live, with changed rows
//! marked; with `--events`, what happens to them, one line per event
//! (`events.rs`).

mod events;

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use diesel::PgConnection;
use leasehold::admin::KeyState;

use crate::connect::Needs;
use crate::context::Context;
use crate::duration;
use crate::failure::CliError;
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::listing::{cells, filter, load, no_keys, row_json, ListArgs, Row, HEADER};
use crate::output::Printer;
use crate::table;

/// Like `ls`, refreshed live until Ctrl-C (or --count refreshes).
/// Rows that changed since the previous refresh are marked with `*`.
/// With --events: one line per wake-up, grant and loss instead.
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {
    /// Which keys.
    #[command(flatten)]
    list: ListArgs,
    /// Time between refreshes.
    #[arg(long, default_value = "500ms", value_parser = duration::parse, allow_hyphen_values = true)]
    interval: Duration,
    /// Stop after this many refreshes, or with --events this many
    /// events (default: until Ctrl-C).
    #[arg(long)]
    count: Option<u64>,
    /// Print events instead of tables, one line each (with --json one
    /// object per line) as they happen: `wake` (a release notification
    /// woke the key's waiters), `acquired`, and the losses `lapsed`,
    /// `released`, `taken_over`; `removed` when a key's row is pruned.
    /// The first line (`watching`) says how many keys are watched.
    /// Registers the watched keys for release notifications (as a
    /// waiter does). --owner keeps the events that concern that owner.
    #[arg(long, conflicts_with_all = ["state", "sort", "limit"])]
    events: bool,
}

/// `leasehold watch`: tables, or with `--events` one line per event.
pub fn run(args: Args, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let conn = &mut session.conn;
    if args.events {
        events::watch_events(
            conn,
            &session.url,
            ctx.out,
            &args.list,
            args.interval,
            args.count,
        )
    } else {
        tables(conn, ctx.out, &args.list, args.interval, args.count)
    }
}

/// `leasehold watch [PREFIX] [--interval D] [--count N]`: a table per
/// refresh.
fn tables(
    conn: &mut PgConnection,
    out: Printer,
    list: &ListArgs,
    interval: Duration,
    count: Option<u64>,
) -> Result<(), CliError> {
    let filter = filter(list);
    let clear = !out.is_json() && std::io::stdout().is_terminal();
    let mut previous: Option<HashMap<String, Fingerprint>> = None;
    let mut refresh: u64 = 0;
    loop {
        refresh += 1;
        let (rows, now) = load(conn, &filter)?;
        let current: HashMap<String, Fingerprint> = rows
            .iter()
            .map(|row| (row.key.clone(), fingerprint(row)))
            .collect();
        let changed: Vec<&Row> = match &previous {
            None => Vec::new(),
            Some(before) => rows
                .iter()
                .filter(|row| before.get(&row.key) != current.get(&row.key))
                .collect(),
        };
        let mut text = String::new();
        if clear {
            text.push_str("\x1b[2J\x1b[H");
        }
        text.push_str(&format!(
            "refresh {refresh} at {} (server time), every {}; Ctrl-C to stop\n",
            now.map_or_else(|| "-".to_owned(), |t| t.to_string()),
            duration::format(interval)
        ));
        if rows.is_empty() {
            text.push_str(&no_keys(list));
            text.push('\n');
        } else {
            let lines: Vec<Vec<String>> = rows
                .iter()
                .map(|row| {
                    // Always one character wide, so columns stay put
                    // from one refresh to the next.
                    let mark = if changed.iter().any(|c| c.key == row.key) {
                        "*"
                    } else {
                        " "
                    };
                    std::iter::once(mark.to_owned()).chain(cells(row)).collect()
                })
                .collect();
            text.push_str(&table::render(&HEADER, &lines));
        }
        let json = Json::Object(vec![
            (
                "refresh",
                Json::Int(i64::try_from(refresh).unwrap_or(i64::MAX)),
            ),
            ("now", Json::time(now)),
            (
                "changed",
                Json::Array(changed.iter().map(|row| Json::str(&row.key)).collect()),
            ),
            ("leases", Json::Array(rows.iter().map(row_json).collect())),
        ]);
        out.emit(&text, &json)?;
        if count.is_some_and(|limit| refresh >= limit) {
            return Ok(());
        }
        previous = Some(current);
        std::thread::sleep(interval);
    }
}

/// What is compared between refreshes to mark a changed row.
type Fingerprint = (KeyState, Option<String>, i64);

fn fingerprint(row: &Row) -> Fingerprint {
    (row.state, row.owner.clone(), row.epoch.get())
}
