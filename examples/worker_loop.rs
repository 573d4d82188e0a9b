//! Workers competing for jobs under leases; one stalls past its ttl, loses
//! its job to a waiting worker, notices, and stops. Prints a timeline.
//!
//! Each worker takes jobs with a [`LeaseWaiter`] (woken by release
//! notifications or at the holder's expiry), keeps the lease alive with a
//! [`Keeper`], and works through [`run_while_held`], checking
//! `ctx.should_stop()` between steps.
//!
//! The stall simulates a stop-the-world pause (a GC pause, a VM freeze): the
//! worker's thread blocks, and so does its keeper's heartbeat (the keeper's
//! event callback blocks while the pause lasts). The keeper's deadline
//! passes, another worker takes the job over after the lease lapses, and
//! when the stalled worker resumes, its first check says stop.
//!
//! Run: `cargo run --example worker_loop` (a throwaway local PostgreSQL, or
//! the server named by `DATABASE_URL`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::{Connection, PgConnection};
use leasehold::{
    error::ErrorKind,
    hold::{run_while_held, CancelToken, KeeperEvent, WorkOutcome},
    wait::{LeaseWaiter, Wait},
    Keeper, Leases,
};
use leasehold_local::{DatabaseServer, LocalPostgres};

const TTL: Duration = Duration::from_secs(1);
const STEPS: u32 = 6;
const STEP: Duration = Duration::from_millis(150);
const PAUSE: Duration = Duration::from_millis(2500);
const JOBS: [&str; 2] = ["job-a", "job-b"];
const WORKERS: [&str; 3] = ["w1", "w2", "w3"];
/// The first worker to hold this job stalls at this step.
const STALLED_JOB: &str = "job-a";
const STALL_AT_STEP: u32 = 3;
/// Taken by the worker that stalls, so only one does.
static STALL_PENDING: AtomicBool = AtomicBool::new(true);

struct Timeline {
    start: Instant,
}

impl Timeline {
    fn log(&self, who: &str, job: &str, what: impl std::fmt::Display) {
        println!(
            "{:>7.3}s  {who:<3} {job:<6} {what}",
            self.start.elapsed().as_secs_f64()
        );
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // DATABASE_URL's server, or a throwaway one removed when this is dropped.
    let server = DatabaseServer::from_env_or_start(LocalPostgres::builder())?;
    if server.local().is_some() {
        println!("no DATABASE_URL: using a throwaway local PostgreSQL");
    }
    let url = server.url();
    leasehold::install(&mut PgConnection::establish(&url)?)?;
    let client = leasehold::LeaseClient::connect(&url, 8)?;
    let waiter = LeaseWaiter::new(&client);
    waiter.wait_until_listening(Duration::from_secs(10));

    println!(
        "ttl {TTL:?}; {} workers, jobs {JOBS:?}; the first holder of {STALLED_JOB} stalls {PAUSE:?} at step {STALL_AT_STEP}\n",
        WORKERS.len()
    );
    let timeline = Arc::new(Timeline {
        start: Instant::now(),
    });
    let done = Arc::new(Mutex::new(HashSet::new()));
    let cancel = CancelToken::new();
    let threads: Vec<_> = WORKERS
        .iter()
        .enumerate()
        .map(|(index, &me)| {
            let (waiter, timeline, done, cancel) = (
                waiter.clone(),
                timeline.clone(),
                done.clone(),
                cancel.clone(),
            );
            std::thread::spawn(move || worker(index, me, &waiter, &timeline, &done, &cancel))
        })
        .collect();
    for thread in threads {
        if let Err(error) = thread.join().map_err(|_| "worker panicked")? {
            eprintln!("worker failed: {error}");
        }
    }
    let done = done.lock().map_err(|_| "poisoned")?;
    println!("\ncompleted: {:?}", {
        let mut jobs: Vec<_> = done.iter().collect();
        jobs.sort();
        jobs
    });
    Ok(())
}

fn worker(
    index: usize,
    me: &'static str,
    waiter: &LeaseWaiter,
    timeline: &Arc<Timeline>,
    done: &Mutex<HashSet<String>>,
    cancel: &CancelToken,
) -> Result<(), String> {
    loop {
        // Next unfinished job, each worker starting at a different one.
        let job = {
            let done = done.lock().map_err(|_| "poisoned")?;
            (0..JOBS.len())
                .map(|i| JOBS[(index + i) % JOBS.len()])
                .find(|job| !done.contains(*job))
        };
        let Some(job) = job else {
            timeline.log(me, "", "no jobs left; exiting");
            return Ok(());
        };
        timeline.log(me, job, "waiting for the lease");
        let lease = match waiter.acquire_cancellable(job, me, TTL, Wait::AtMost(TTL * 6), cancel) {
            Ok(lease) => lease,
            Err(error) if error.kind() == ErrorKind::TimedOut => continue,
            Err(error) => return Err(error.to_string()),
        };
        if done.lock().map_err(|_| "poisoned")?.contains(job) {
            let _ = waiter.client().clone().release(&lease);
            continue;
        }
        timeline.log(me, job, format!("acquired, epoch {}", lease.epoch()));

        // A stop-the-world pause stalls the keeper's heartbeat too.
        let paused = Arc::new(AtomicBool::new(false));
        let keeper = {
            let (paused, timeline) = (paused.clone(), timeline.clone());
            Keeper::builder(waiter.client(), lease)
                .on_event(move |event| match event {
                    KeeperEvent::Renewed { .. } => {
                        while paused.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                    KeeperEvent::Lost(why) => {
                        timeline.log(me, job, format!("keeper: lease lost ({why})"));
                    }
                    _ => {}
                })
                .start()
                .map_err(|e| e.to_string())?
        };
        let outcome = run_while_held(keeper, cancel, |ctx| {
            for step in 1..=STEPS {
                if job == STALLED_JOB
                    && step == STALL_AT_STEP
                    && STALL_PENDING.swap(false, Ordering::SeqCst)
                {
                    timeline.log(
                        me,
                        job,
                        format!("stalls for {PAUSE:?} (simulated GC pause)"),
                    );
                    paused.store(true, Ordering::SeqCst);
                    std::thread::sleep(PAUSE);
                    paused.store(false, Ordering::SeqCst);
                    timeline.log(me, job, "resumes");
                }
                if ctx.should_stop() {
                    return Err(step);
                }
                // One step of work; a real job writes through a guard with
                // ctx.token(), which would refuse a superseded epoch.
                std::thread::sleep(STEP);
                timeline.log(
                    me,
                    job,
                    format!("step {step}/{STEPS} (epoch {})", ctx.token().epoch()),
                );
            }
            Ok(())
        });
        match outcome {
            WorkOutcome::Finished(()) => {
                done.lock().map_err(|_| "poisoned")?.insert(job.to_owned());
                timeline.log(me, job, "finished; lease released");
            }
            WorkOutcome::LeaseLost(why) => {
                timeline.log(me, job, format!("noticed the loss ({why}); stops"));
                return Ok(());
            }
            WorkOutcome::Cancelled => return Ok(()),
            WorkOutcome::Failed(step) => {
                return Err(format!("{me} failed at step {step} of {job}"));
            }
        }
    }
}
