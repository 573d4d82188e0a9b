//! The history of a nemesis run, and the checker that judges it.
//!
//! Shared by the nemesis test (`tests/nemesis/main.rs`) and the long-run
//! command (`examples/nemesis.rs`), so that both judge runs with exactly the same rules. It is test tooling, not library
//! API: it knows the record format the nemesis workers write and nothing
//! else.
//!
//! # Records
//!
//! One record per line: a kind, then space-separated `name=value` fields.
//! Times are server times (`clock_timestamp()` or values derived from the
//! server's answers) in microseconds since the Unix epoch; keys, owners,
//! resources and operation ids never contain spaces. Every worker appends to
//! its own file with one `write(2)` per line, so a worker killed by SIGKILL
//! loses at most the line it had not written yet; the parser skips a torn
//! last line.
//!
//! # Outcomes
//!
//! A call can end in three ways: acknowledged (`grant`, `renew`,
//! `release_ok`, `write_ok`), definitely not applied (`denied`, `renew_lost`,
//! `release_lost`, `write_refused`), or unknown (`*_unknown`, or no outcome
//! line at all because the worker was killed mid-call). The checker judges
//! unknown calls leniently — a violation is reported only when *every*
//! resolution of the unknown outcomes violates an invariant — so a correct
//! system never fails the check, while the acknowledged facts alone still
//! convict a broken one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An acknowledged acquire: `start` is the server time the grant was
    /// made (expires_at - ttl), `end` its expiry.
    Grant {
        key: String,
        owner: String,
        epoch: i64,
        start: i64,
        end: i64,
    },
    /// An acquire whose outcome is unknown (the connection broke).
    AcquireUnknown { key: String, owner: String },
    /// An acquire denied because another owner held the key.
    Denied { key: String, owner: String },
    /// An acknowledged renewal made at server time `at`, extending to `end`.
    Renew {
        key: String,
        owner: String,
        epoch: i64,
        at: i64,
        end: i64,
    },
    /// An acknowledged renewal through the key's heartbeat group (the join
    /// that renewed it, or a group heartbeat that answered the key still a
    /// member): the same fact as `Renew`, counted apart so that a run can
    /// show it exercised groups.
    GroupRenew {
        key: String,
        owner: String,
        epoch: i64,
        at: i64,
        end: i64,
    },
    /// A renewal refused with a status (nothing changed).
    RenewLost {
        key: String,
        owner: String,
        epoch: i64,
        status: String,
    },
    /// A renewal whose outcome is unknown.
    RenewUnknown {
        key: String,
        owner: String,
        epoch: i64,
    },
    /// A release is about to be sent.
    ReleaseInvoke {
        key: String,
        owner: String,
        epoch: i64,
    },
    /// An acknowledged release.
    ReleaseOk {
        key: String,
        owner: String,
        epoch: i64,
    },
    /// A release refused with a status (nothing changed).
    ReleaseLost {
        key: String,
        owner: String,
        epoch: i64,
        status: String,
    },
    /// A release whose outcome is unknown.
    ReleaseUnknown {
        key: String,
        owner: String,
        epoch: i64,
    },
    /// A guarded write is about to be sent. `held` is true for a
    /// lease-checked write (`admit_held`), false for a token-only one.
    WriteInvoke {
        op: String,
        resource: String,
        key: String,
        owner: String,
        epoch: i64,
        held: bool,
    },
    /// An acknowledged (committed) guarded write: its sequence number and
    /// the server time its transaction began.
    WriteOk { op: String, seq: i64, at: i64 },
    /// A guarded write the guard refused (rolled back), with the reason.
    WriteRefused { op: String, reason: String },
    /// A guarded write whose outcome is unknown.
    WriteUnknown { op: String },
    /// An inspect made between server times `before` and `after`.
    Inspect {
        key: String,
        before: i64,
        after: i64,
        held: bool,
        epoch: i64,
    },
    /// A row of the guarded table as found after the run (not written by
    /// workers; added by the driver).
    Row {
        op: String,
        resource: String,
        epoch: i64,
        seq: i64,
        at: i64,
    },
    /// A nemesis action (pause, kill, crash), for the counts only.
    Nemesis { action: String },
}

impl Event {
    /// The record line for this event (without the newline).
    pub fn to_line(&self) -> String {
        match self {
            Event::Grant {
                key,
                owner,
                epoch,
                start,
                end,
            } => format!("grant key={key} owner={owner} epoch={epoch} start={start} end={end}"),
            Event::AcquireUnknown { key, owner } => {
                format!("acquire_unknown key={key} owner={owner}")
            }
            Event::Denied { key, owner } => format!("denied key={key} owner={owner}"),
            Event::Renew {
                key,
                owner,
                epoch,
                at,
                end,
            } => format!("renew key={key} owner={owner} epoch={epoch} at={at} end={end}"),
            Event::GroupRenew {
                key,
                owner,
                epoch,
                at,
                end,
            } => format!("group_renew key={key} owner={owner} epoch={epoch} at={at} end={end}"),
            Event::RenewLost {
                key,
                owner,
                epoch,
                status,
            } => format!("renew_lost key={key} owner={owner} epoch={epoch} status={status}"),
            Event::RenewUnknown { key, owner, epoch } => {
                format!("renew_unknown key={key} owner={owner} epoch={epoch}")
            }
            Event::ReleaseInvoke { key, owner, epoch } => {
                format!("release_invoke key={key} owner={owner} epoch={epoch}")
            }
            Event::ReleaseOk { key, owner, epoch } => {
                format!("release_ok key={key} owner={owner} epoch={epoch}")
            }
            Event::ReleaseLost {
                key,
                owner,
                epoch,
                status,
            } => format!("release_lost key={key} owner={owner} epoch={epoch} status={status}"),
            Event::ReleaseUnknown { key, owner, epoch } => {
                format!("release_unknown key={key} owner={owner} epoch={epoch}")
            }
            Event::WriteInvoke {
                op,
                resource,
                key,
                owner,
                epoch,
                held,
            } => format!(
                "write_invoke op={op} resource={resource} key={key} owner={owner} epoch={epoch} held={}",
                u8::from(*held)
            ),
            Event::WriteOk { op, seq, at } => format!("write_ok op={op} seq={seq} at={at}"),
            Event::WriteRefused { op, reason } => format!("write_refused op={op} reason={reason}"),
            Event::WriteUnknown { op } => format!("write_unknown op={op}"),
            Event::Inspect {
                key,
                before,
                after,
                held,
                epoch,
            } => format!(
                "inspect key={key} before={before} after={after} held={} epoch={epoch}",
                u8::from(*held)
            ),
            Event::Row {
                op,
                resource,
                epoch,
                seq,
                at,
            } => format!("row op={op} resource={resource} epoch={epoch} seq={seq} at={at}"),
            Event::Nemesis { action } => format!("nemesis action={action}"),
        }
    }

    /// Parses one record line; `None` for a malformed (e.g. torn) line.
    pub fn parse(line: &str) -> Option<Event> {
        let mut parts = line.split_whitespace();
        let kind = parts.next()?;
        let fields: HashMap<&str, &str> = parts.filter_map(|p| p.split_once('=')).collect();
        let s = |name: &str| fields.get(name).map(|v| (*v).to_owned());
        let n = |name: &str| fields.get(name).and_then(|v| v.parse::<i64>().ok());
        let b = |name: &str| fields.get(name).map(|v| *v == "1");
        Some(match kind {
            "grant" => Event::Grant {
                key: s("key")?,
                owner: s("owner")?,
                epoch: n("epoch")?,
                start: n("start")?,
                end: n("end")?,
            },
            "acquire_unknown" => Event::AcquireUnknown {
                key: s("key")?,
                owner: s("owner")?,
            },
            "denied" => Event::Denied {
                key: s("key")?,
                owner: s("owner")?,
            },
            "renew" => Event::Renew {
                key: s("key")?,
                owner: s("owner")?,
                epoch: n("epoch")?,
                at: n("at")?,
                end: n("end")?,
            },
            "group_renew" => Event::GroupRenew {
                key: s("key")?,
                owner: s("owner")?,
                epoch: n("epoch")?,
                at: n("at")?,
                end: n("end")?,
            },
            "renew_lost" => Event::RenewLost {
                key: s("key")?,
                owner: s("owner")?,
                epoch: n("epoch")?,
                status: s("status")?,
            },
            "renew_unknown" => Event::RenewUnknown {
                key: s("key")?,
                owner: s("owner")?,
                epoch: n("epoch")?,
            },
            "release_invoke" => Event::ReleaseInvoke {
                key: s("key")?,
                owner: s("owner")?,
                epoch: n("epoch")?,
            },
            "release_ok" => Event::ReleaseOk {
                key: s("key")?,
                owner: s("owner")?,
                epoch: n("epoch")?,
            },
            "release_lost" => Event::ReleaseLost {
                key: s("key")?,
                owner: s("owner")?,
                epoch: n("epoch")?,
                status: s("status")?,
            },
            "release_unknown" => Event::ReleaseUnknown {
                key: s("key")?,
                owner: s("owner")?,
                epoch: n("epoch")?,
            },
            "write_invoke" => Event::WriteInvoke {
                op: s("op")?,
                resource: s("resource")?,
                key: s("key")?,
                owner: s("owner")?,
                epoch: n("epoch")?,
                held: b("held")?,
            },
            "write_ok" => Event::WriteOk {
                op: s("op")?,
                seq: n("seq")?,
                at: n("at")?,
            },
            "write_refused" => Event::WriteRefused {
                op: s("op")?,
                reason: s("reason")?,
            },
            "write_unknown" => Event::WriteUnknown { op: s("op")? },
            "inspect" => Event::Inspect {
                key: s("key")?,
                before: n("before")?,
                after: n("after")?,
                held: b("held")?,
                epoch: n("epoch")?,
            },
            "row" => Event::Row {
                op: s("op")?,
                resource: s("resource")?,
                epoch: n("epoch")?,
                seq: n("seq")?,
                at: n("at")?,
            },
            "nemesis" => Event::Nemesis {
                action: s("action")?,
            },
            _ => return None,
        })
    }
}

/// Parses a whole history, skipping malformed lines (a worker killed while
/// writing leaves at most one torn line at the end of its file).
pub fn parse_history(text: &str) -> Vec<Event> {
    text.lines().filter_map(Event::parse).collect()
}

/// The invariant a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// I1: a grant started before an earlier grant of the key ended.
    Overlap,
    /// I1: one (key, epoch) was granted to two owners.
    DoubleGrant,
    /// I2/I3: in server time, a later grant of a key did not carry a greater
    /// epoch.
    EpochOrder,
    /// I2/I11: an inspect (e.g. after a crash) reported a counter below an
    /// epoch granted before it, or a later grant did not exceed it.
    EpochRegressed,
    /// G4: per resource in commit order, a committed write carried a lower
    /// epoch than an earlier committed write.
    StaleWriteCommitted,
    /// G2: a write the guard refused is visible in the table.
    RefusedWriteVisible,
    /// G6: a lease-checked write committed although a grant of a higher
    /// epoch had started before its transaction did.
    HeldWriteAfterTakeover,
    /// Durability: an acknowledged write is missing (or different) after the
    /// crashes.
    LostWrite,
    /// A row nobody tried to write.
    PhantomWrite,
}

impl Kind {
    /// The invariant's name in docs/SPECIFICATION.md §3 (or "durability").
    pub fn invariant(self) -> &'static str {
        match self {
            Kind::Overlap | Kind::DoubleGrant => "I1",
            Kind::EpochOrder => "I2/I3",
            Kind::EpochRegressed => "I2/I11",
            Kind::StaleWriteCommitted => "G4",
            Kind::RefusedWriteVisible => "G2",
            Kind::HeldWriteAfterTakeover => "G6",
            Kind::LostWrite => "§1.6 durability",
            Kind::PhantomWrite => "G3",
        }
    }
}

/// One broken rule, with the facts that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What broke.
    pub kind: Kind,
    /// The records involved.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} ({}): {}",
            self.kind,
            self.kind.invariant(),
            self.detail
        )
    }
}

/// What a history contained and what the checker found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Lease and write operations attempted (every outcome record, plus
    /// calls cut off by a kill).
    pub operations: usize,
    /// Distinct acknowledged grants.
    pub grants: usize,
    /// Grants whose predecessor (the previous acknowledged grant of the
    /// key) was not released: taken over after a lapse.
    pub takeovers: usize,
    /// Acknowledged renewals.
    pub renewals: usize,
    /// Of those, renewals through a heartbeat group.
    pub group_renewals: usize,
    /// Committed rows in the guarded table.
    pub committed_writes: usize,
    /// Writes the guard refused.
    pub refused_writes: usize,
    /// Calls whose outcome was unknown (connection lost, or cut off).
    pub unknown_outcomes: usize,
    /// Inspects checked against the grants (after crash recoveries).
    pub inspects: usize,
    /// Nemesis actions by name.
    pub nemesis: BTreeMap<String, usize>,
    /// Everything that broke.
    pub violations: Vec<Violation>,
}

impl Report {
    /// The violation kinds found, deduplicated.
    pub fn kinds(&self) -> Vec<Kind> {
        let mut kinds: Vec<Kind> = self.violations.iter().map(|v| v.kind).collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }
}

/// A grant as reconstructed from the acknowledged records.
#[derive(Debug, Clone)]
struct GrantView {
    key: String,
    owner: String,
    epoch: i64,
    start: i64,
    /// Expiry as extended by acknowledged renewals.
    expiry: i64,
    /// The latest server time at which an acknowledged call proved the
    /// grant live (acquire, renewals, lease-checked writes).
    last_alive: i64,
    /// A release was sent that may have committed.
    maybe_released: bool,
    /// A release was acknowledged.
    released: bool,
    /// The earliest server time at which a later call of the holder ran
    /// (a renewal, a guarded write's transaction): the acquire had
    /// committed by then. The grant's start is when its statement read
    /// the clock, which can precede its commit by the commit's latency.
    committed_by: Option<i64>,
}

impl GrantView {
    /// The earliest instant the grant can have ended under any resolution
    /// of unknown outcomes. A takeover of a lapsed grant re-checks the
    /// expiry on the latest row version with its own start time, so that
    /// bound is exact; after a (possibly) committed release, a competitor's
    /// start time may have been read while it waited for the release's row
    /// lock, so only the last proof of life is a safe bound.
    fn earliest_end(&self) -> i64 {
        if self.maybe_released {
            self.last_alive
        } else {
            self.expiry
        }
    }
}

/// Checks a history (all workers' records, the driver's inspects, and the
/// final table rows) against I1, I2/I3, I11, G2, G3, G4, G6 and durability.
pub fn check(events: &[Event]) -> Report {
    let mut report = Report::default();
    let mut grants: BTreeMap<(String, i64), GrantView> = BTreeMap::new();
    let mut invokes: HashMap<&str, (&str, &str, &str, i64, bool)> = HashMap::new();
    let mut acked_writes: HashMap<&str, (i64, i64)> = HashMap::new();
    let mut refused: HashSet<&str> = HashSet::new();
    let mut write_outcomes: HashSet<&str> = HashSet::new();
    let mut release_outcomes = 0usize;
    let mut release_invokes = 0usize;
    let mut rows: Vec<(&str, &str, i64, i64, i64)> = Vec::new();
    let mut inspects: Vec<(&str, i64, i64, bool, i64)> = Vec::new();

    // Pass 1: grants, keyed by (key, epoch).
    for event in events {
        if let Event::Grant {
            key,
            owner,
            epoch,
            start,
            end,
        } = event
        {
            match grants.get_mut(&(key.clone(), *epoch)) {
                Some(existing) if existing.owner != *owner => {
                    report.violations.push(Violation {
                        kind: Kind::DoubleGrant,
                        detail: format!(
                            "key {key} epoch {epoch} granted to {} and to {owner}",
                            existing.owner
                        ),
                    });
                }
                // The same owner's idempotent re-acquire: the same grant.
                Some(existing) => {
                    existing.start = existing.start.min(*start);
                    existing.expiry = existing.expiry.max(*end);
                }
                None => {
                    grants.insert(
                        (key.clone(), *epoch),
                        GrantView {
                            key: key.clone(),
                            owner: owner.clone(),
                            epoch: *epoch,
                            start: *start,
                            expiry: *end,
                            last_alive: *start,
                            maybe_released: false,
                            released: false,
                            committed_by: None,
                        },
                    );
                }
            }
        }
    }

    // Pass 2: everything else.
    for event in events {
        match event {
            Event::Grant { .. } => report.operations += 1,
            Event::Denied { .. } => report.operations += 1,
            Event::AcquireUnknown { .. } | Event::RenewUnknown { .. } => {
                report.operations += 1;
                report.unknown_outcomes += 1;
            }
            Event::Renew {
                key,
                owner,
                epoch,
                at,
                end,
            }
            | Event::GroupRenew {
                key,
                owner,
                epoch,
                at,
                end,
            } => {
                report.operations += 1;
                report.renewals += 1;
                if matches!(event, Event::GroupRenew { .. }) {
                    report.group_renewals += 1;
                }
                if let Some(grant) = grants.get_mut(&(key.clone(), *epoch)) {
                    if grant.owner == *owner {
                        grant.expiry = grant.expiry.max(*end);
                        grant.last_alive = grant.last_alive.max(*at);
                        grant.committed_by = Some(grant.committed_by.map_or(*at, |t| t.min(*at)));
                    }
                }
            }
            Event::RenewLost { .. } => report.operations += 1,
            Event::ReleaseInvoke { key, owner, epoch } => {
                release_invokes += 1;
                if let Some(grant) = grants.get_mut(&(key.clone(), *epoch)) {
                    if grant.owner == *owner {
                        grant.maybe_released = true;
                    }
                }
            }
            Event::ReleaseOk { key, owner, epoch } => {
                release_outcomes += 1;
                report.operations += 1;
                if let Some(grant) = grants.get_mut(&(key.clone(), *epoch)) {
                    if grant.owner == *owner {
                        grant.released = true;
                        grant.maybe_released = true;
                    }
                }
            }
            Event::ReleaseUnknown { .. } => {
                release_outcomes += 1;
                report.operations += 1;
                report.unknown_outcomes += 1;
            }
            Event::ReleaseLost {
                key, owner, epoch, ..
            } => {
                // Definitely not applied (it had lapsed, or was never
                // ours): the grant ends at its expiry after all.
                release_outcomes += 1;
                report.operations += 1;
                if let Some(grant) = grants.get_mut(&(key.clone(), *epoch)) {
                    if grant.owner == *owner && !grant.released {
                        grant.maybe_released = false;
                    }
                }
            }
            Event::WriteInvoke {
                op,
                resource,
                key,
                owner,
                epoch,
                held,
            } => {
                invokes.insert(op, (resource, key, owner, *epoch, *held));
            }
            Event::WriteOk { op, seq, at } => {
                report.operations += 1;
                write_outcomes.insert(op);
                acked_writes.insert(op, (*seq, *at));
            }
            Event::WriteRefused { op, .. } => {
                report.operations += 1;
                report.refused_writes += 1;
                write_outcomes.insert(op);
                refused.insert(op);
            }
            Event::WriteUnknown { op } => {
                report.operations += 1;
                report.unknown_outcomes += 1;
                write_outcomes.insert(op);
            }
            Event::Inspect {
                key,
                before,
                after,
                held,
                epoch,
            } => inspects.push((key, *before, *after, *held, *epoch)),
            Event::Row {
                op,
                resource,
                epoch,
                seq,
                at,
            } => rows.push((op, resource, *epoch, *seq, *at)),
            Event::Nemesis { action } => *report.nemesis.entry(action.clone()).or_default() += 1,
        }
    }
    // Releases whose worker was killed before it could record an outcome.
    let cut_off_releases = release_invokes.saturating_sub(release_outcomes);
    let cut_off_writes = invokes
        .keys()
        .filter(|op| !write_outcomes.contains(*op))
        .count();
    report.operations += cut_off_releases + cut_off_writes;
    report.unknown_outcomes += cut_off_releases + cut_off_writes;

    // An acknowledged write's transaction began after the acquire was
    // acknowledged, so the grant had committed by then.
    for (op, (_, at)) in &acked_writes {
        if let Some((_, key, owner, epoch, _)) = invokes.get(op) {
            if let Some(grant) = grants.get_mut(&((*key).to_owned(), *epoch)) {
                if grant.owner == *owner {
                    grant.committed_by = Some(grant.committed_by.map_or(*at, |t| t.min(*at)));
                }
            }
        }
    }
    // A committed lease-checked write proves its grant live when its
    // transaction began.
    for (op, _, epoch, _, at) in &rows {
        if let Some((_, key, owner, _, true)) = invokes.get(op) {
            if let Some(grant) = grants.get_mut(&((*key).to_owned(), *epoch)) {
                if grant.owner == *owner {
                    grant.last_alive = grant.last_alive.max(*at);
                }
            }
        }
    }

    report.grants = grants.len();
    report.committed_writes = rows.len();
    report.inspects = inspects.len();

    let mut by_key: BTreeMap<&str, Vec<&GrantView>> = BTreeMap::new();
    for grant in grants.values() {
        by_key.entry(&grant.key).or_default().push(grant);
    }

    for (key, list) in &by_key {
        // I1: in epoch order, no grant starts before every earlier grant
        // of the key has ended.
        let mut by_epoch = list.clone();
        by_epoch.sort_by_key(|g| g.epoch);
        let mut latest_end: Option<&GrantView> = None;
        for grant in &by_epoch {
            if let Some(prev) = latest_end {
                if grant.start < prev.earliest_end() {
                    report.violations.push(Violation {
                        kind: Kind::Overlap,
                        detail: format!(
                            "key {key}: epoch {} ({}) granted at {} while epoch {} ({}) held until at least {}",
                            grant.epoch,
                            grant.owner,
                            grant.start,
                            prev.epoch,
                            prev.owner,
                            prev.earliest_end()
                        ),
                    });
                }
                if !prev.released {
                    report.takeovers += 1;
                }
            }
            if latest_end.is_none_or(|p| grant.earliest_end() > p.earliest_end()) {
                latest_end = Some(grant);
            }
        }
        // I2/I3: in server time, each grant's epoch exceeds all before it.
        let mut by_start = list.clone();
        by_start.sort_by_key(|g| (g.start, g.epoch));
        let mut max_epoch: Option<&GrantView> = None;
        for grant in &by_start {
            if let Some(prev) = max_epoch {
                if grant.epoch <= prev.epoch {
                    report.violations.push(Violation {
                        kind: Kind::EpochOrder,
                        detail: format!(
                            "key {key}: grant at {} has epoch {}, not above epoch {} granted at {}",
                            grant.start, grant.epoch, prev.epoch, prev.start
                        ),
                    });
                }
            }
            if max_epoch.is_none_or(|p| grant.epoch > p.epoch) {
                max_epoch = Some(grant);
            }
        }
    }

    // I2/I11: what inspect reports (e.g. right after a crash recovery) is
    // never below an epoch granted before, and later grants exceed it.
    for (key, before, after, held, counter) in &inspects {
        for grant in by_key.get(key).into_iter().flatten() {
            // Only grants provably committed before the inspect count.
            if grant.committed_by.is_some_and(|t| t < *before) && grant.epoch > *counter {
                report.violations.push(Violation {
                    kind: Kind::EpochRegressed,
                    detail: format!(
                        "key {key}: inspect at {before} reported epoch {counter} (held={held}), below epoch {} granted at {} and committed by {:?}",
                        grant.epoch, grant.start, grant.committed_by
                    ),
                });
            }
            if grant.start > *after && grant.epoch <= *counter {
                report.violations.push(Violation {
                    kind: Kind::EpochRegressed,
                    detail: format!(
                        "key {key}: grant at {} has epoch {}, not above epoch {counter} reported at {after}",
                        grant.start, grant.epoch
                    ),
                });
            }
        }
    }

    // G4: per resource in commit order (sequence values are drawn after the
    // guard row is locked, so they follow commit order), epochs never drop.
    let mut by_resource: BTreeMap<&str, Vec<(i64, i64, &str)>> = BTreeMap::new();
    for (op, resource, epoch, seq, _) in &rows {
        by_resource
            .entry(resource)
            .or_default()
            .push((*seq, *epoch, op));
    }
    for (resource, list) in &mut by_resource {
        list.sort();
        let mut highest: Option<(i64, i64, &str)> = None;
        for &(seq, epoch, op) in list.iter() {
            if let Some((hseq, hepoch, hop)) = highest {
                if epoch < hepoch {
                    report.violations.push(Violation {
                        kind: Kind::StaleWriteCommitted,
                        detail: format!(
                            "resource {resource}: write {op} (seq {seq}) with epoch {epoch} committed after write {hop} (seq {hseq}) with epoch {hepoch}"
                        ),
                    });
                }
            }
            if highest.is_none_or(|(_, hepoch, _)| epoch > hepoch) {
                highest = Some((seq, epoch, op));
            }
        }
    }

    let row_ops: HashMap<&str, (i64, i64)> = rows
        .iter()
        .map(|(op, _, epoch, seq, _)| (*op, (*seq, *epoch)))
        .collect();
    // Durability: every acknowledged write is there, unchanged.
    for (op, (seq, _)) in &acked_writes {
        let expected_epoch = invokes.get(op).map(|i| i.3);
        match row_ops.get(op) {
            Some((row_seq, row_epoch)) if row_seq == seq && Some(*row_epoch) == expected_epoch => {}
            other => report.violations.push(Violation {
                kind: Kind::LostWrite,
                detail: format!(
                    "write {op} was acknowledged with seq {seq}, but the table has {other:?}"
                ),
            }),
        }
    }
    for (op, resource, epoch, seq, at) in &rows {
        // G2: refused writes leave nothing behind.
        if refused.contains(op) {
            report.violations.push(Violation {
                kind: Kind::RefusedWriteVisible,
                detail: format!("write {op} was refused but is in the table (seq {seq})"),
            });
        }
        match invokes.get(op) {
            None => report.violations.push(Violation {
                kind: Kind::PhantomWrite,
                detail: format!("row {op} (resource {resource}, seq {seq}) was never written"),
            }),
            Some((_, key, _, _, held)) => {
                // G6: a lease-checked write cannot commit for a grant that a
                // higher epoch had already superseded when it began.
                if *held {
                    for grant in by_key.get(key).into_iter().flatten() {
                        if grant.epoch > *epoch && grant.start <= *at {
                            report.violations.push(Violation {
                                kind: Kind::HeldWriteAfterTakeover,
                                detail: format!(
                                    "lease-checked write {op} with epoch {epoch} began at {at}, after epoch {} of key {key} was granted at {}",
                                    grant.epoch, grant.start
                                ),
                            });
                        }
                    }
                }
            }
        }
    }
    report
}
