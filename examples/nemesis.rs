//! The long nemesis run: worker processes acquire, renew, write through
//! guards and release leases on a few keys while a nemesis pauses them
//! (SIGSTOP/SIGCONT), kills them (SIGKILL) and crash-restarts the server
//! (SIGKILL of the postmaster, then crash recovery). A checker then verifies
//! the recorded history: no two grants of a key overlap in server time (I1),
//! epochs strictly increase (I2/I3) and never regress across crashes (I11),
//! guarded resources never accept a lower epoch after a higher one (G4) nor
//! show a refused write (G2), lease-checked writes never follow a takeover
//! (G6), and no acknowledged write is lost.
//!
//! ```text
//! cargo run --release --example nemesis -- --duration 600 --seed 7
//! ```
//!
//! Options: `--duration <seconds>` (default 600), `--seed <n>` (default 7),
//! `--workers <n>` (default 4), `--keys <n>` (default 3), `--verbose`,
//! `--prune` (a concurrent pruner, docs/SPECIFICATION.md §1.8)
//! (print each nemesis action). Exits with status 1 if any invariant broke,
//! keeping the history files for inspection. Needs the PostgreSQL server
//! binaries, like the tests.

use std::process::{Command, ExitCode};
use std::time::Duration;

use leasehold_test_support::nemesis::run;

fn main() -> ExitCode {
    if let Some(spec) = run::worker_spec_from_env() {
        run::worker_main(&spec);
        return ExitCode::SUCCESS;
    }
    let mut options = run::Options {
        duration: Duration::from_secs(600),
        seed: 7,
        workers: 4,
        keys: 3,
        verbose: false,
        prune: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage(&format!("{name} needs a whole number")))
        };
        match arg.as_str() {
            "--duration" => options.duration = Duration::from_secs(number("--duration")),
            "--seed" => options.seed = number("--seed"),
            "--workers" => options.workers = number("--workers").max(1) as usize,
            "--keys" => options.keys = number("--keys").max(1) as usize,
            "--verbose" => options.verbose = true,
            "--prune" => options.prune = true,
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| {
        eprintln!("cannot find this executable to start workers: {e}");
        std::process::exit(2)
    });
    let outcome = run::run(&options, &|| Command::new(&exe));
    print!("{}", outcome.summary(&options));
    if outcome.report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("error: {problem}");
    }
    eprintln!(
        "usage: cargo run --release --example nemesis -- [--duration SECONDS] [--seed N] \
         [--workers N] [--keys N] [--verbose] [--prune]"
    );
    std::process::exit(if problem.is_empty() { 0 } else { 2 })
}
