//! `leasehold run KEY -- CMD ARGS...`: runs a command while holding a lease.
//!
//! The shell and cron story: acquire (or wait for) the lease, keep it alive
//! with a [`Keeper`] while CMD runs, and hand CMD the grant in its
//! environment so it can fence its writes:
//!
//! | variable | value |
//! |---|---|
//! | `LEASEHOLD_KEY` | the lease key |
//! | `LEASEHOLD_OWNER` | the owner the grant was made to |
//! | `LEASEHOLD_EPOCH` | the grant's fencing epoch |
//! | `LEASEHOLD_TOKEN` | the fencing token (`leasehold renew --token` and guards take it) |
//!
//! **Loss.** The supervisor sleeps until 5 ms before the keeper's safe
//! deadline (the last successful renew's send time + ttl − margin) or
//! 20 ms, whichever comes first, and checks the keeper. When a renew was
//! refused, or the deadline is 5 ms away with no renew since, it sends CMD
//! SIGTERM at once, and SIGKILL after the grace period
//! (`--grace`, default the keeper's margin, ttl / 10). With the default
//! grace, SIGKILL lands no later than the server's expiry of the last
//! renewed grant; anything CMD writes after the safe deadline must carry
//! the token to a guard, which refuses it once a successor's epoch reached
//! the resource. `run` then exits 4 (lapsed).
//!
//! **End.** When CMD exits, `run` releases the lease, or, with
//! `--hold-at-least D`, renews it once so that it lapses D after the grant
//! began (ShedLock's "lock at least for"): a job that finished early keeps
//! other runners out for its minimum period. `run` exits with CMD's status
//! (128 + N when a signal N ended it).
//!
//! **Signals.** SIGINT, SIGTERM and SIGHUP sent to `run` are passed on to
//! CMD; the lease stays kept until CMD exits, then is released as above.
//!
//! **The whole job.** CMD runs in a process group of its own (as under
//! `timeout(1)`), and every signal above goes to the group: the children
//! and grandchildren a script starts stop with it. When CMD exits, `run`
//! stops what is left of its group (SIGTERM, SIGKILL after the grace)
//! before it releases the lease or reports the loss, so nothing of the job
//! runs on without the lease. A process that leaves the group (`setsid`, a
//! daemon) is on its own; a CMD that reads the terminal is stopped by it,
//! as a background job is.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::PgConnection;
use leasehold::{hold::LeaseLoss, Keeper, Lease, LeaseClient, Leases, Renewal};
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;

use super::acquire::obtain;
use crate::connect::Needs;
use crate::context::Context;
use crate::duration;
use crate::failure::{report, CliError};
use crate::help::RUN_EXIT_CODES;

/// Longest sleep of the supervisor between two looks at CMD and the keeper.
const TICK: Duration = Duration::from_millis(20);
/// How long before the keeper's safe deadline the supervisor stops CMD when
/// no renew has moved the deadline: a sleep ends a little after its
/// target, and the deadline is the last moment, not a suggestion.
const AHEAD: Duration = Duration::from_millis(5);
/// The signals `run` passes on to CMD.
const FORWARDED: [i32; 3] = [
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
];

/// Run CMD while holding KEY: acquire it (or --wait for it), keep it
/// alive while CMD runs, stop CMD (SIGTERM, then SIGKILL after --grace)
/// if the lease is lost, and release it when CMD ends (or hold it until
/// --hold-at-least after it began). CMD gets LEASEHOLD_KEY,
/// LEASEHOLD_OWNER, LEASEHOLD_EPOCH and LEASEHOLD_TOKEN; SIGINT, SIGTERM
/// and SIGHUP sent to `run` are passed on to it. CMD runs in a process
/// group of its own, and every signal goes to the whole group: the
/// children and grandchildren a script starts are stopped with it, and
/// whatever is left of the group when CMD ends is stopped before the
/// release.
#[derive(Debug, clap::Args)]
#[command(after_help = RUN_EXIT_CODES)]
pub struct Args {
    /// The lease key, e.g. nightly-billing.
    key: String,
    /// Who acquires it (default: HOST:PID of this process).
    #[arg(long)]
    owner: Option<String>,
    /// The grant's ttl; the keeper renews it every ttl/3 and treats it
    /// as lost ttl/10 before it would lapse.
    #[arg(long, value_parser = duration::parse, default_value = "30s", allow_hyphen_values = true)]
    ttl: Duration,
    /// Wait up to this long while another owner holds the key (exit 7
    /// on timeout) instead of failing at once (exit 3).
    #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
    wait: Option<Duration>,
    /// Keep the grant until this long after it began even if CMD ends
    /// sooner, so no other runner starts the job again meanwhile.
    #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
    hold_at_least: Option<Duration>,
    /// After a loss, how long CMD has between SIGTERM and SIGKILL
    /// (default: the keeper's margin, ttl/10, so SIGKILL lands no later
    /// than the server's expiry of the last renewed grant).
    #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
    grace: Option<Duration>,
    /// The command and its arguments, after --.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// `leasehold run`: exits with CMD's own status once CMD ran under the
/// lease.
pub fn run(args: Args, ctx: &Context) -> Result<u8, CliError> {
    let request = RunRequest {
        key: &args.key,
        owner: args.owner.clone().unwrap_or_else(default_owner),
        ttl: args.ttl,
        wait: args.wait,
        hold_at_least: args.hold_at_least,
        grace: args.grace,
        command: &args.command,
    };
    let mut session = ctx.connect(Needs::Installed)?;
    run_under_lease(&mut session.conn, &session.url, &request)
}

/// What `leasehold run` was asked to do.
struct RunRequest<'a> {
    /// The lease key.
    key: &'a str,
    /// The owner to acquire as.
    owner: String,
    /// The grant's ttl, renewed by the keeper.
    ttl: Duration,
    /// Wait this long for a held key (None: fail at once, exit 3).
    wait: Option<Duration>,
    /// Keep the grant at least this long after it began.
    hold_at_least: Option<Duration>,
    /// SIGTERM to SIGKILL after a loss (None: the keeper's margin).
    grace: Option<Duration>,
    /// CMD and its arguments.
    command: &'a [OsString],
}

/// The default owner: host name and process id, unique among concurrent
/// runners and readable in `leasehold ls`.
fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

/// Runs the request; returns the exit code for the process.
fn run_under_lease(
    conn: &mut PgConnection,
    url: &str,
    request: &RunRequest<'_>,
) -> Result<u8, CliError> {
    let Some((program, args)) = request.command.split_first() else {
        return Err(CliError::InvalidInput(
            "no command given: write it after --, e.g. `leasehold run KEY -- ./job.sh`".into(),
        ));
    };
    let began = Instant::now();
    let lease = obtain(
        conn,
        url,
        request.key,
        &request.owner,
        request.ttl,
        request.wait,
    )?;
    // Caught from the grant on (while waiting for it, a signal ends `run`
    // as usual: nothing is held then), so no signal ends `run` without
    // ending CMD and releasing the lease.
    let pending = Arc::new(AtomicUsize::new(0));
    for signal in FORWARDED {
        if let Err(error) =
            signal_hook::flag::register_usize(signal, pending.clone(), signal as usize)
        {
            let _ = conn.release(&lease);
            return Err(CliError::Database(format!(
                "cannot catch signal {signal}: {error}"
            )));
        }
    }
    let keeper = match LeaseClient::connect(url, 2)
        .map_err(CliError::from)
        .and_then(|client| {
            Keeper::builder(&client, lease.clone())
                .ttl(request.ttl)
                .start()
                .map_err(|error| CliError::Database(report(&error)))
        }) {
        Ok(keeper) => keeper,
        Err(error) => {
            // CMD never ran: give the grant back rather than let it lapse.
            let _ = conn.release(&lease);
            return Err(error);
        }
    };
    let grace = request.grace.unwrap_or_else(|| keeper.margin());

    // Orphaned members of CMD's group come back to `run`, which reaps them
    // (a container's first process may not), so an empty group is seen.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let mut child = match Command::new(program)
        .args(args)
        .process_group(0)
        .env("LEASEHOLD_KEY", lease.key())
        .env("LEASEHOLD_OWNER", lease.owner())
        .env("LEASEHOLD_EPOCH", lease.epoch().to_string())
        .env("LEASEHOLD_TOKEN", lease.token().to_string())
        .spawn()
    {
        Ok(child) => child,
        Err(source) => {
            let _ = keeper.stop();
            return Err(CliError::CommandNotStarted {
                command: program.to_string_lossy().into_owned(),
                source,
            });
        }
    };
    let ended = supervise(&mut child, &keeper, &pending, grace)?;
    stop_the_rest(&ended.group, grace);
    match ended.lost {
        Some((loss, ahead)) => {
            let _ = keeper.stop();
            Err(CliError::LostWhileRunning {
                key: lease.key().to_owned(),
                epoch: lease.epoch().get(),
                loss: loss.to_string(),
                ahead,
                status: describe(ended.status),
            })
        }
        None => {
            finish(conn, keeper, request.hold_at_least, began)?;
            Ok(exit_code(ended.status))
        }
    }
}

/// How CMD ended, and whether the lease was lost first.
struct Ended {
    status: ExitStatus,
    /// The loss and how long before the safe deadline SIGTERM was sent.
    lost: Option<(LeaseLoss, Duration)>,
    /// CMD's process group, and what it was sent so far.
    group: Group,
}

/// CMD's process group: CMD's pid, since it leads the group it was started in.
struct Group {
    id: Pid,
    /// When SIGKILL is due, once SIGTERM was sent.
    kill_at: Option<Instant>,
}

impl Group {
    /// Sends `signal` to every process of the group; false when none is left.
    fn signal(&self, signal: Option<Signal>) -> bool {
        killpg(self.id, signal) != Err(Errno::ESRCH)
    }

    /// Reaps the group's members that ended after CMD did (they are `run`'s
    /// children once orphaned); whether any member is still there.
    fn any_left(&self) -> bool {
        while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            if status.pid().is_none() {
                break;
            }
        }
        self.signal(None)
    }
}

/// How long `run` waits, after SIGKILL, for the group's last members to go.
const GONE_BOUND: Duration = Duration::from_secs(5);

/// Once CMD has exited: stops what is left of its group, SIGTERM then
/// SIGKILL after `grace` (or when the SIGKILL a loss set is due), and waits
/// (bounded) until the group is empty.
fn stop_the_rest(group: &Group, grace: Duration) {
    if !group.any_left() {
        return;
    }
    let kill_at = match group.kill_at {
        Some(at) => at,
        None => {
            eprintln!(
                "leasehold run: the command left processes in its group; sent them SIGTERM, SIGKILL follows in {}",
                duration::format(grace)
            );
            group.signal(Some(Signal::SIGTERM));
            Instant::now() + grace
        }
    };
    let mut deadline = kill_at;
    let mut killed = false;
    while group.any_left() {
        if Instant::now() >= deadline {
            if killed {
                eprintln!(
                    "leasehold run: processes of the command's group outlived SIGKILL by {}",
                    duration::format(GONE_BOUND)
                );
                return;
            }
            group.signal(Some(Signal::SIGKILL));
            killed = true;
            deadline = Instant::now() + GONE_BOUND;
        }
        std::thread::sleep(TICK.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// Waits for CMD, passing signals on and stopping it once the lease is no
/// longer safe.
fn supervise(
    child: &mut Child,
    keeper: &Keeper,
    pending: &AtomicUsize,
    grace: Duration,
) -> Result<Ended, CliError> {
    let mut group = Group {
        id: Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX)),
        kill_at: None,
    };
    let mut lost: Option<(LeaseLoss, Duration)> = None;
    let mut kill_at: Option<Instant> = None;
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|error| CliError::Database(format!("cannot wait for the command: {error}")))?
        {
            group.kill_at = kill_at.or(lost.as_ref().map(|_| Instant::now()));
            return Ok(Ended {
                status,
                lost,
                group,
            });
        }
        let signal = pending.swap(0, Ordering::SeqCst);
        if signal != 0 {
            if let Ok(signal) = Signal::try_from(signal as i32) {
                group.signal(Some(signal));
            }
        }
        let safe_until = keeper.safe_until();
        let stop_at = safe_until.checked_sub(AHEAD).unwrap_or(safe_until);
        if lost.is_none() && (!keeper.is_valid() || Instant::now() >= stop_at) {
            let ahead = safe_until.saturating_duration_since(Instant::now());
            let loss = keeper
                .loss()
                .unwrap_or(LeaseLoss::DeadlinePassed { last_error: None });
            eprintln!(
                "leasehold run: lease lost ({loss}); sent SIGTERM to the command, SIGKILL follows in {}",
                duration::format(grace)
            );
            group.signal(Some(Signal::SIGTERM));
            kill_at = Some(Instant::now() + grace);
            lost = Some((loss, ahead));
        }
        let now = Instant::now();
        if let Some(at) = kill_at {
            if now >= at {
                group.signal(Some(Signal::SIGKILL));
                kill_at = None;
            }
        }
        // Sleep until just before the safe deadline at the latest, so the
        // SIGTERM is not later than it; wake early when the keeper reports
        // a loss.
        let mut nap = TICK;
        if lost.is_none() {
            nap = nap.min(stop_at.saturating_duration_since(now));
        }
        if let Some(at) = kill_at {
            nap = nap.min(at.saturating_duration_since(now));
        }
        if lost.is_none() {
            let _ = keeper.wait_for_loss(nap);
        } else {
            std::thread::sleep(nap);
        }
    }
}

/// After CMD ended with the lease safe: release it, or keep it until
/// `hold_at_least` after `began`.
fn finish(
    conn: &mut PgConnection,
    keeper: Keeper,
    hold_at_least: Option<Duration>,
    began: Instant,
) -> Result<(), CliError> {
    let left = hold_at_least.and_then(|hold| hold.checked_sub(began.elapsed()));
    match left.filter(|left| *left >= Duration::from_millis(1)) {
        None => {
            // Refused only if the grant ended in the instant since CMD's
            // exit was seen with the lease safe: nothing left to release.
            let _released = keeper
                .stop()
                .map_err(|error| CliError::Database(report(&error)))?;
        }
        Some(left) => {
            let lease: Lease = keeper.stop_renewing();
            match conn.renew(&lease, left).map_err(CliError::from)? {
                Renewal::Renewed { expires_at } => eprintln!(
                    "leasehold run: holding {:?} until {expires_at} (--hold-at-least)",
                    lease.key()
                ),
                // Lost meanwhile: nothing to hold any more.
                Renewal::Refused(_) => {}
            }
        }
    }
    Ok(())
}

/// CMD's status as a process exit code: its own code, or 128 + the signal
/// that ended it (the shell's convention).
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from((128 + signal) & 0xff).unwrap_or(1),
        (None, None) => 1,
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with {code}"),
        (None, Some(signal)) => format!("ended by signal {signal}"),
        (None, None) => "ended".to_owned(),
    }
}
