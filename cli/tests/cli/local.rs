//! `leasehold local start|stop|status|env`: a real development server in a
//! scratch directory (LEASEHOLD_LOCAL_DIR), started and stopped by the
//! binary, keeping its data between starts; commands without a URL use it
//! while it runs and refuse while it does not.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::support::{command, Run};

struct Local {
    dir: PathBuf,
    /// What the test removes at its end: `dir` or a directory above it.
    top: PathBuf,
}

impl Local {
    fn new(name: &str) -> Self {
        // Under /tmp: the server may run as another user (root's tests run
        // it as postgres), who must be able to enter the directory.
        let dir = PathBuf::from(format!("/tmp/lh-cli-local-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Local {
            top: dir.clone(),
            dir,
        }
    }

    /// The server in `below`, a path under `top` (a fresh directory under
    /// /tmp, not created here).
    fn below(name: &str, below: &str) -> Self {
        let top = PathBuf::from(format!("/tmp/lh-cli-local-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&top);
        Local {
            dir: top.join(below),
            top,
        }
    }

    fn run(&self, args: &[&str]) -> Run {
        Self::finish(self.command(args).output().unwrap())
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut command = command(args);
        command.env("LEASEHOLD_LOCAL_DIR", &self.dir);
        command
    }

    fn finish(output: std::process::Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = self.run(&["local", "stop"]);
        let _ = std::fs::remove_dir_all(&self.top);
    }
}

#[test]
fn local_start_status_env_stop_and_commands_without_a_url_use_it_while_it_runs() {
    let local = Local::new("cycle");
    // Stopping a server never started here stops nothing and creates
    // nothing.
    assert_eq!(local.run(&["local", "stop"]).code, 0);
    assert!(!local.dir.exists());
    // Not created yet: status and env say so (exit 14); commands refuse.
    assert_eq!(local.run(&["local", "status"]).code, 14);
    let env = local.run(&["local", "env"]);
    assert_eq!(env.code, 14, "{env:?}");
    assert!(env.stderr.contains("leasehold local start"), "{env:?}");
    let refused = local.run(&["inspect", "job"]);
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(
        refused.stderr.contains("leasehold local start"),
        "{refused:?}"
    );

    let started = local.run(&["--json", "local", "start"]);
    assert_eq!(started.code, 0, "{started:?}");
    let url = started.json()["url"].as_str().unwrap().to_owned();
    assert!(url.starts_with("postgres://postgres@127.0.0.1:"), "{url}");
    // Idempotent: a second start answers the same URL.
    let again = local.run(&["--json", "local", "start"]);
    assert_eq!(again.json()["url"], url.as_str());
    assert_eq!(local.run(&["local", "status"]).code, 0);
    let env = local.run(&["local", "env"]);
    assert_eq!(env.stdout.trim(), format!("export DATABASE_URL='{url}'"));

    // Without --database-url, commands use it (and say so on stderr).
    let acquired = local.run(&["--json", "acquire", "job", "dev", "--ttl", "1h"]);
    assert_eq!(acquired.code, 0, "{acquired:?}");
    assert!(acquired.stderr.contains(&url), "{acquired:?}");
    assert_eq!(acquired.json()["epoch"], 1);

    // Stopped: its data stays; commands refuse until it runs again.
    assert_eq!(local.run(&["local", "stop"]).code, 0);
    assert_eq!(local.run(&["local", "status"]).code, 14);
    assert_eq!(local.run(&["inspect", "job"]).code, 2);
    assert_eq!(local.run(&["local", "start"]).code, 0);
    let held = local.run(&["--json", "inspect", "job"]);
    assert_eq!(held.code, 0, "{held:?}");
    assert_eq!(held.json()["owner"], "dev");
    assert_eq!(held.json()["epoch"], 1);
    // An explicit URL still wins over the development server.
    let elsewhere = local.run(&[
        "--database-url",
        "postgres://nobody@127.0.0.1:1/db",
        "inspect",
        "job",
    ]);
    assert_eq!(elsewhere.code, 8, "{elsewhere:?}");
}

/// Starts that overlap (two terminals, a parallel make, jobs started
/// together) all succeed and answer one URL: the first creates and starts
/// the server, the others wait for it instead of running initdb or pg_ctl
/// on the same directory at once. The same for stops. None of the
/// directories exist yet, so the starts also create them at once.
#[test]
fn starts_and_stops_at_once_all_succeed_on_one_server() {
    let local = Local::below("overlap", "home/.local/share/leasehold/local");
    let at_once = |args: &[&str]| -> Vec<Run> {
        let children: Vec<_> = (0..3)
            .map(|_| {
                local
                    .command(args)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        children
            .into_iter()
            .map(|child| Local::finish(child.wait_with_output().unwrap()))
            .collect()
    };
    let starts = at_once(&["--json", "local", "start"]);
    for start in &starts {
        assert_eq!(start.code, 0, "{start:?}");
    }
    let url = starts[0].json()["url"].as_str().unwrap().to_owned();
    for start in &starts {
        assert_eq!(start.json()["url"], url.as_str(), "{starts:?}");
    }
    assert_eq!(local.run(&["local", "status"]).code, 0);
    for stop in at_once(&["local", "stop"]) {
        assert_eq!(stop.code, 0, "{stop:?}");
    }
    assert_eq!(local.run(&["local", "status"]).code, 14);
}

/// When initdb cannot create the cluster, the error names the directory it
/// was asked to create (not the temporary directory) and quotes initdb,
/// and nothing starts.
#[test]
fn a_cluster_initdb_cannot_create_is_named_in_the_error() {
    let local = Local::new("initdb");
    let data = local.dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("stray"), "not a cluster").unwrap();
    let start = local.run(&["local", "start"]);
    assert_eq!(start.code, 8, "{start:?}");
    assert!(
        start
            .stderr
            .contains(&format!("initdb could not create {}", data.display())),
        "{start:?}"
    );
    assert!(
        start.stderr.contains("exists but is not empty"),
        "{start:?}"
    );
    assert_eq!(local.run(&["local", "status"]).code, 14);
}

fn is_root() -> bool {
    let id = std::process::Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&id.stdout).trim() == "0"
}

/// The first start on a fresh machine: none of the directories on the way
/// to the server's exist (a home's `.local/share/leasehold/local` under a
/// new directory in /tmp). As root the server runs as `postgres`, which
/// must pass through every directory the start creates; it used to find
/// them root-only and fail with "could not run initdb: Permission denied".
/// As any other user it all runs as that user.
#[test]
fn a_first_start_creates_every_directory_so_the_server_user_can_enter_it() {
    let local = Local::below("fresh", "home/.local/share/leasehold/local");
    assert!(!local.top.exists());

    let started = local.run(&["--json", "local", "start"]);
    assert_eq!(started.code, 0, "{started:?}");
    let url = started.json()["url"].as_str().unwrap().to_owned();
    let acquired = local.run(&["--json", "acquire", "job", "dev", "--ttl", "1h"]);
    assert_eq!(acquired.code, 0, "{acquired:?}");
    assert!(acquired.stderr.contains(&url), "{acquired:?}");
    assert_eq!(acquired.json()["epoch"], 1);
    let stopped = local.run(&["local", "stop"]);
    assert_eq!(stopped.code, 0, "{stopped:?}");
    assert!(stopped.stdout.contains("stopped"), "{stopped:?}");

    // What was created lets in the server user and no one else.
    let mut created: Vec<&Path> = local
        .dir
        .ancestors()
        .take_while(|dir| dir.starts_with(&local.top))
        .collect();
    created.reverse();
    for dir in created {
        let mode = std::fs::metadata(dir).unwrap().mode() & 0o777;
        assert_eq!(mode & 0o007, 0, "{} has mode {mode:o}", dir.display());
    }
}

/// A directory that already exists on the way and that the server user
/// cannot enter is named, with its mode and owner, before anything is
/// created; it is not loosened. Only root's server runs as another user.
#[test]
fn an_existing_directory_the_server_user_cannot_enter_is_named_and_left_alone() {
    if !is_root() {
        eprintln!("skipped: only root runs the server as another user (postgres)");
        return;
    }
    let local = Local::below("closed", "leasehold/local");
    std::fs::create_dir(&local.top).unwrap();
    std::fs::set_permissions(&local.top, std::fs::Permissions::from_mode(0o700)).unwrap();

    let start = local.run(&["local", "start"]);
    assert_eq!(start.code, 8, "{start:?}");
    let expected = format!(
        "the server user postgres cannot enter {} (mode 0700, owner root, group root)",
        local.top.display()
    );
    assert!(start.stderr.contains(&expected), "{start:?}");
    assert!(start.stderr.contains("LEASEHOLD_LOCAL_DIR"), "{start:?}");
    assert!(!local.top.join("leasehold").exists());
    let mode = std::fs::metadata(&local.top).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o700);
    assert_eq!(local.run(&["local", "status"]).code, 14);
}
