//! The workload under failover: worker threads acquire, renew and release a
//! few keys and write through a database guard, on the cluster's
//! multi-host URL; every call is recorded as a nemesis history event, so
//! the nemesis checker (`leasehold_test_support::nemesis::history`) judges
//! the run with the same rules as the single-server nemesis.
//!
//! A worker that loses its connection (the primary died, or was demoted)
//! reconnects through the multi-host URL, which finds the new primary, and
//! carries on as a new owner (`w<index>.<incarnation>`): whatever it held
//! before is abandoned and lapses at its expiry, as a restarted process's
//! would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use diesel::sql_types::{BigInt, Text, Timestamptz};
use leasehold::guard::Fencing;
use leasehold::{
    guard::{Check, FencedError},
    Acquisition, ErrorKind, LeaseState, Leases, Refusal, Release, Renewal,
};
use leasehold_test_support::nemesis::history::Event;
use leasehold_test_support::nemesis::run::Rng;
use leasehold_test_support::server_now;

/// The guarded table: the sequence value is drawn inside the fenced
/// transaction, after the guard row is locked, so it follows commit order
/// per resource; `at` is the transaction's start (server time).
pub const SCHEMA: &str = "CREATE TABLE ha_writes (
    seq bigserial PRIMARY KEY,
    op text NOT NULL UNIQUE,
    resource text NOT NULL,
    key text NOT NULL,
    owner text NOT NULL,
    epoch bigint NOT NULL,
    at timestamptz NOT NULL)";

/// What the workers share with the driver.
#[derive(Default)]
pub struct Shared {
    stop: AtomicBool,
    /// When each acknowledged write was acknowledged (this process's clock).
    acked_writes: Mutex<Vec<Instant>>,
}

impl Shared {
    /// Acknowledged writes whose acknowledgement came after `since`.
    pub fn writes_after(&self, since: Instant) -> usize {
        self.lock().iter().filter(|&&t| t > since).count()
    }

    /// The first acknowledged write after `since`.
    pub fn first_write_after(&self, since: Instant) -> Option<Instant> {
        self.lock().iter().copied().filter(|&t| t > since).min()
    }

    /// The longest interval without an acknowledged write that overlaps
    /// `[from, to]`: from the last write before `from` (or `from`) to the
    /// first write after it, and so on until the first write after `to`.
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Option<Duration> {
        let mut times = self.lock().clone();
        times.sort();
        let start = times
            .iter()
            .copied()
            .filter(|&t| t <= from)
            .max()
            .unwrap_or(from);
        let end = times.iter().copied().find(|&t| t > to)?;
        let mut points: Vec<Instant> = vec![start];
        points.extend(times.iter().copied().filter(|&t| t > start && t < end));
        points.push(end);
        points.windows(2).map(|w| w[1] - w[0]).max()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Instant>> {
        self.acked_writes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Running worker threads.
pub struct Workers {
    pub shared: Arc<Shared>,
    handles: Vec<JoinHandle<Vec<Event>>>,
}

impl Workers {
    /// Starts `count` workers on `keys` keys against `url`.
    pub fn start(url: &str, count: usize, keys: usize, seed: u64) -> Workers {
        let shared = Arc::new(Shared::default());
        let handles = (0..count)
            .map(|index| {
                let shared = Arc::clone(&shared);
                let url = url.to_owned();
                std::thread::Builder::new()
                    .name(format!("ha-worker-{index}"))
                    .spawn(move || worker(index, &url, keys, seed, &shared))
                    .unwrap_or_else(|e| panic!("spawn worker {index}: {e}"))
            })
            .collect();
        Workers { shared, handles }
    }

    /// Waits until at least `count` writes were acknowledged after `since`
    /// (the workers made progress), or panics after `timeout`.
    pub fn wait_for_writes_after(
        &self,
        since: Instant,
        count: usize,
        timeout: Duration,
        what: &str,
    ) {
        let deadline = Instant::now() + timeout;
        while self.shared.writes_after(since) < count {
            assert!(
                Instant::now() < deadline,
                "{what}: fewer than {count} acknowledged writes within {timeout:?} \
                 (the workers did not carry on)"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the workers and returns everything they recorded.
    pub fn stop(self) -> Vec<Event> {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|_| panic!("a worker panicked")))
            .collect()
    }
}

#[derive(QueryableByName)]
struct Written {
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Timestamptz)]
    at: DateTime<Utc>,
}

enum WriteOutcome {
    Ok(i64, DateTime<Utc>),
    Refused(&'static str),
    Unknown,
}

fn worker(index: usize, url: &str, keys: usize, seed: u64, shared: &Shared) -> Vec<Event> {
    let mut rng = Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(index as u64));
    let mut out = Vec::new();
    let mut conn: Option<PgConnection> = None;
    let mut incarnation = 0usize;
    let mut writes = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        let Some(c) = conn.as_mut() else {
            // No primary yet (failover in progress): poll until the
            // multi-host URL finds a writable node.
            match PgConnection::establish(url) {
                Ok(c) => {
                    conn = Some(c);
                    incarnation += 1;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
            continue;
        };
        let owner = format!("w{index}.{incarnation}");
        // The same ttl for every grant of this owner, so that an idempotent
        // re-acquire reports the original grant's times.
        let ttl = Duration::from_millis(800 + 400 * (incarnation as u64 % 3));
        let ttl_us = ttl.as_micros() as i64;
        let key = format!("k{}", rng.range(0, keys as u64));
        let resource = format!("res-{key}");
        let lease = match c.acquire(&key, &owner, ttl) {
            Ok(Acquisition::Granted(lease)) => {
                out.push(Event::Grant {
                    key: key.clone(),
                    owner: owner.clone(),
                    epoch: lease.epoch().get(),
                    start: lease.expires_at().timestamp_micros() - ttl_us,
                    end: lease.expires_at().timestamp_micros(),
                });
                lease
            }
            Ok(Acquisition::Denied) => {
                out.push(Event::Denied { key, owner });
                std::thread::sleep(Duration::from_millis(rng.range(0, 30)));
                continue;
            }
            Err(e) if e.kind() == ErrorKind::OutcomeUnknown => {
                out.push(Event::AcquireUnknown { key, owner });
                conn = None;
                continue;
            }
            Err(_) => {
                conn = None;
                continue;
            }
        };
        let epoch = lease.epoch();
        let token = lease.token();
        let mut alive = true;
        for _ in 0..rng.range(1, 5) {
            writes += 1;
            let op = format!("{owner}-{writes}");
            let held = rng.chance(50);
            out.push(Event::WriteInvoke {
                op: op.clone(),
                resource: resource.clone(),
                key: key.clone(),
                owner: owner.clone(),
                epoch: epoch.get(),
                held,
            });
            let check = if held { Check::LeaseHeld } else { Check::Token };
            let result = c.run_fenced(&resource, &token, check, |c| {
                diesel::sql_query(
                    "INSERT INTO ha_writes (op, resource, key, owner, epoch, at) \
                     VALUES ($1, $2, $3, $4, $5, now()) RETURNING seq, at",
                )
                .bind::<Text, _>(&op)
                .bind::<Text, _>(&resource)
                .bind::<Text, _>(&key)
                .bind::<Text, _>(&owner)
                .bind::<BigInt, _>(epoch)
                .get_result::<Written>(c)
            });
            let outcome = match result {
                Ok(w) => WriteOutcome::Ok(w.seq, w.at),
                // A guard's refusal (not a fenced table's).
                Err(FencedError::Guard(e))
                    if e.kind() == ErrorKind::Fenced && e.table().is_none() =>
                {
                    match e.refusal() {
                        Some(Refusal::StaleEpoch { .. }) => WriteOutcome::Refused("stale_epoch"),
                        Some(Refusal::EpochNotGranted { .. }) => {
                            WriteOutcome::Refused("epoch_not_granted")
                        }
                        Some(Refusal::WrongKey) => WriteOutcome::Refused("wrong_key"),
                        // The lease-checked refusal names the token's owner.
                        _ if e.owner().is_some() => WriteOutcome::Refused("lease_not_held"),
                        _ => WriteOutcome::Unknown,
                    }
                }
                Err(_) => WriteOutcome::Unknown,
            };
            match outcome {
                WriteOutcome::Ok(seq, at) => {
                    shared
                        .acked_writes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(Instant::now());
                    out.push(Event::WriteOk {
                        op,
                        seq,
                        at: at.timestamp_micros(),
                    });
                }
                WriteOutcome::Refused(reason) => {
                    out.push(Event::WriteRefused {
                        op,
                        reason: reason.to_owned(),
                    });
                    break;
                }
                WriteOutcome::Unknown => {
                    out.push(Event::WriteUnknown { op });
                    alive = false;
                    break;
                }
            }
            std::thread::sleep(Duration::from_micros(rng.range(0, ttl_us as u64 / 4)));
            match c.renew(&leasehold_test_support::grant(&key, &owner, epoch), ttl) {
                Ok(Renewal::Renewed { expires_at }) => out.push(Event::Renew {
                    key: key.clone(),
                    owner: owner.clone(),
                    epoch: epoch.get(),
                    at: expires_at.timestamp_micros() - ttl_us,
                    end: expires_at.timestamp_micros(),
                }),
                Ok(Renewal::Refused(why)) => {
                    out.push(Event::RenewLost {
                        key: key.clone(),
                        owner: owner.clone(),
                        epoch: epoch.get(),
                        status: why.as_status().to_owned(),
                    });
                    break;
                }
                Err(_) => {
                    out.push(Event::RenewUnknown {
                        key: key.clone(),
                        owner: owner.clone(),
                        epoch: epoch.get(),
                    });
                    alive = false;
                    break;
                }
            }
        }
        if !alive {
            conn = None;
            continue;
        }
        if rng.chance(70) {
            out.push(Event::ReleaseInvoke {
                key: key.clone(),
                owner: owner.clone(),
                epoch: epoch.get(),
            });
            match c.release(&leasehold_test_support::grant(&key, &owner, epoch)) {
                Ok(Release::Released) => out.push(Event::ReleaseOk {
                    key,
                    owner,
                    epoch: epoch.get(),
                }),
                Ok(Release::Refused(why)) => out.push(Event::ReleaseLost {
                    key,
                    owner,
                    epoch: epoch.get(),
                    status: why.as_status().to_owned(),
                }),
                Err(_) => {
                    out.push(Event::ReleaseUnknown {
                        key,
                        owner,
                        epoch: epoch.get(),
                    });
                    conn = None;
                }
            }
        }
    }
    out
}

/// `inspect` of every key on `conn`, bracketed by server times: after a
/// failover, checked against every grant acknowledged before it.
pub fn inspect_all(conn: &mut PgConnection, keys: usize) -> Vec<Event> {
    let mut out = Vec::new();
    for k in 0..keys {
        let key = format!("k{k}");
        let before = server_now(conn);
        let state = conn
            .inspect(&key)
            .unwrap_or_else(|e| panic!("inspect {key}: {e}"));
        let after = server_now(conn);
        if let Some(state) = state {
            out.push(Event::Inspect {
                key,
                before: before.timestamp_micros(),
                after: after.timestamp_micros(),
                held: matches!(state, LeaseState::Held { .. }),
                epoch: state.epoch().get(),
            });
        }
    }
    out
}

#[derive(QueryableByName)]
struct RowLine {
    #[diesel(sql_type = Text)]
    op: String,
    #[diesel(sql_type = Text)]
    resource: String,
    #[diesel(sql_type = BigInt)]
    epoch: i64,
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Timestamptz)]
    at: DateTime<Utc>,
}

/// The guarded table as the final primary has it.
pub fn final_rows(conn: &mut PgConnection) -> Result<Vec<Event>, DieselError> {
    Ok(
        diesel::sql_query("SELECT op, resource, epoch, seq, at FROM ha_writes ORDER BY seq")
            .load::<RowLine>(conn)?
            .into_iter()
            .map(|r| Event::Row {
                op: r.op,
                resource: r.resource,
                epoch: r.epoch,
                seq: r.seq,
                at: r.at.timestamp_micros(),
            })
            .collect(),
    )
}
