//! A real HA cluster for failover tests: one etcd and two or three Patroni
//! nodes on loopback ports, in a private temporary directory, torn down on
//! drop (also while a panic unwinds).
//!
//! Needs the Debian packages `patroni`, `etcd-server` and `etcd-client`
//! (`apt-get install -y patroni etcd-server etcd-client`); without them
//! [`PatroniCluster::start`] panics saying so, it never skips. Nothing is
//! started by the packages themselves.
//!
//! Every wait synchronises on observable state: Patroni's REST API
//! (`GET /patroni` on each node: role, state, and on the leader the
//! `replication` rows with `state = streaming`; `GET /cluster` for the
//! synchronous standby the `/sync` key names) and, for "writable",
//! `pg_is_in_recovery()` over a direct connection. Nothing sleeps and
//! hopes; polls are bounded and a timeout panics with the nodes' log tails.
//!
//! # Root
//!
//! Patroni starts PostgreSQL, which refuses to run as root; when this
//! process is root each Patroni runs as the `postgres` system user
//! (`runuser -u postgres --`) and the cluster's directory is handed to it.
//!
//! # Killing a node
//!
//! [`PatroniCluster::kill_node`] SIGKILLs the node's Patroni *and* its
//! postmaster and backends. Killing only Patroni would leave its postmaster
//! running as a writable primary (there is no watchdog here): a real split
//! brain, which is not what these tests are about.

pub mod http;

use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::Bool;
use serde_json::Value;

/// What to install when a binary is missing.
const INSTALL_HINT: &str = "apt-get install -y patroni etcd-server etcd-client";

/// Patroni's DCS ttl, loop_wait and retry_timeout (seconds). Patroni wants
/// `loop_wait + 2 * retry_timeout <= ttl`. A leader that dies is replaced
/// after about `ttl`.
const TTL: u64 = 5;
const LOOP_WAIT: u64 = 1;
const RETRY_TIMEOUT: u64 = 2;

/// Bounds for the waits: bootstrapping (initdb, base backup) on a loaded
/// two-core machine, and a failover (about `TTL`, plus a promotion).
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const LEADER_TIMEOUT: Duration = Duration::from_secs(90);
/// Between two polls of the REST API.
const POLL: Duration = Duration::from_millis(100);

/// Replication mode of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Asynchronous streaming replication: a failover can lose the last
    /// acknowledged commits of the old primary.
    Async,
    /// Patroni's `synchronous_mode`: a commit is acknowledged only after the
    /// synchronous standby has it, and only that standby may be promoted.
    Sync,
}

/// One Patroni node.
#[derive(Debug)]
struct Node {
    name: String,
    api_port: u16,
    pg_port: u16,
    data_dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
    /// `runuser` (or Patroni itself) in its own process group, while running.
    patroni: Option<Child>,
}

/// An etcd and 2 or 3 Patroni nodes; see the module documentation.
#[derive(Debug)]
pub struct PatroniCluster {
    root: PathBuf,
    mode: Mode,
    etcd: Option<Child>,
    etcd_port: u16,
    etcd_log: PathBuf,
    nodes: Vec<Node>,
    run_as_postgres: bool,
}

impl PatroniCluster {
    /// Starts etcd and `nodes` (2 or 3) Patroni nodes, and waits until one
    /// node leads, every other node streams from it, and (in
    /// [`Mode::Sync`]) the `/sync` key names a synchronous standby. Panics
    /// with what to install when `patroni` or `etcd` is missing.
    pub fn start(nodes: usize, mode: Mode) -> PatroniCluster {
        assert!(
            (2..=3).contains(&nodes),
            "a PatroniCluster has 2 or 3 nodes, not {nodes}"
        );
        for program in ["patroni", "etcd"] {
            if find_in_path(program).is_none() {
                panic!(
                    "`{program}` is not installed; the HA tests need Patroni and etcd: {INSTALL_HINT}"
                );
            }
        }
        let run_as_postgres = effective_uid() == Some(0);
        if run_as_postgres && find_in_path("runuser").is_none() {
            panic!("running as root, the HA tests need `runuser` (util-linux) to start Patroni as `postgres`");
        }
        let bin_dir = postgres_bin_dir();
        let root = unique_dir();
        fs::create_dir_all(&root).unwrap_or_else(|e| panic!("create {}: {e}", root.display()));
        let ports = free_ports(1 + 2 * nodes);
        let mut cluster = PatroniCluster {
            etcd_log: root.join("etcd.log"),
            root,
            mode,
            etcd: None,
            etcd_port: ports[0],
            nodes: Vec::new(),
            run_as_postgres,
        };
        // From here on, a panic drops `cluster`, which tears down whatever
        // was started.
        let peer_port = free_ports(1)[0];
        cluster.start_etcd(peer_port);
        let scope = cluster
            .root
            .file_name()
            .map(|n| n.to_string_lossy().replace(['-', '.'], "_"))
            .unwrap_or_else(|| "leasehold".into());
        for i in 0..nodes {
            let name = format!("n{i}");
            let node = Node {
                config: cluster.root.join(format!("{name}.yml")),
                log: cluster.root.join(format!("{name}.log")),
                data_dir: cluster.root.join(format!("{name}-data")),
                api_port: ports[1 + 2 * i],
                pg_port: ports[2 + 2 * i],
                name,
                patroni: None,
            };
            let yaml = cluster.config_for(&scope, &node, &bin_dir);
            fs::write(&node.config, yaml)
                .unwrap_or_else(|e| panic!("write {}: {e}", node.config.display()));
            cluster.nodes.push(node);
        }
        if run_as_postgres {
            chown_to_postgres(&cluster.root);
        }
        for i in 0..nodes {
            cluster.start_node(i);
        }
        cluster.wait_ready();
        cluster
    }

    /// The replication mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// How many nodes the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a cluster has 2 or 3 nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A node's name (`n0`, `n1`, ...).
    pub fn name(&self, node: usize) -> &str {
        &self.nodes[node].name
    }

    /// The private directory holding configs, data directories and logs.
    pub fn root_dir(&self) -> &Path {
        &self.root
    }

    /// libpq URL of every node, selecting the writable one:
    /// `postgres://postgres@127.0.0.1:p1,127.0.0.1:p2/<db>?target_session_attrs=read-write`
    /// with `connect_timeout=2` and a 5 s `statement_timeout` (a client of
    /// a node that is being killed must not hang). Trust authentication on
    /// loopback: no password.
    pub fn multi_host_url(&self, database: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.pg_port))
            .collect();
        format!(
            "postgres://postgres@{}/{database}?target_session_attrs=read-write&connect_timeout=2&options=-c%20statement_timeout%3D5000",
            hosts.join(",")
        )
    }

    /// libpq URL of one node (whatever its role).
    pub fn node_url(&self, node: usize, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}?connect_timeout=2&options=-c%20statement_timeout%3D5000",
            self.nodes[node].pg_port
        )
    }

    /// `GET /patroni` of a node, or `None` when it does not answer.
    pub fn status(&self, node: usize) -> Option<Value> {
        http::get_json(self.nodes[node].api_port, "/patroni")
    }

    /// `GET /cluster` asked of any node that answers.
    pub fn cluster_view(&self) -> Option<Value> {
        self.running()
            .find_map(|i| http::get_json(self.nodes[i].api_port, "/cluster"))
    }

    /// The node whose Patroni reports itself the running primary, if
    /// exactly one does.
    pub fn try_leader(&self) -> Option<usize> {
        let leaders: Vec<usize> = self
            .running()
            .filter(|&i| self.status(i).as_ref().is_some_and(is_running_primary))
            .collect();
        match leaders[..] {
            [one] => Some(one),
            _ => None,
        }
    }

    /// The current leader; panics when there is none (or more than one).
    pub fn leader(&self) -> usize {
        self.try_leader().unwrap_or_else(|| {
            panic!(
                "no single leader in the Patroni cluster\n{}",
                self.diagnostics()
            )
        })
    }

    /// SIGKILLs the leader's Patroni and its postmaster (with its backends);
    /// returns the node killed. The cluster fails over after about the DCS
    /// ttl; see [`PatroniCluster::wait_for_new_leader`].
    pub fn kill_leader(&mut self) -> usize {
        let leader = self.leader();
        self.kill_node(leader);
        leader
    }

    /// SIGSTOPs the leader's walsenders, so that nothing it commits from
    /// now on reaches a standby: a replica lagging by everything after this
    /// instant. In [`Mode::Async`] the leader keeps acknowledging commits
    /// that a failover will lose; in [`Mode::Sync`] its commits wait for the
    /// standby. Returns the stopped pids; [`PatroniCluster::kill_leader`]
    /// kills them with the rest of the leader.
    pub fn stall_replication(&self) -> Vec<u32> {
        let leader = self.leader();
        let postmaster = postmaster_pid(&self.nodes[leader].data_dir)
            .unwrap_or_else(|| panic!("leader {} has no postmaster", self.nodes[leader].name));
        let walsenders: Vec<u32> = children_of(postmaster)
            .into_iter()
            .filter(|pid| {
                fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("walsender"))
            })
            .collect();
        assert!(
            !walsenders.is_empty(),
            "leader {} has no walsender to stall\n{}",
            self.nodes[leader].name,
            self.diagnostics()
        );
        for &pid in &walsenders {
            signal(pid, libc::SIGSTOP);
        }
        walsenders
    }

    /// SIGKILLs a node's Patroni and its postmaster with its backends (no
    /// shutdown, no checkpoint), and waits until they are gone.
    pub fn kill_node(&mut self, node: usize) {
        let postmaster = postmaster_pid(&self.nodes[node].data_dir);
        let backends = postmaster.map(children_of).unwrap_or_default();
        if let Some(mut child) = self.nodes[node].patroni.take() {
            kill_group(child.id());
            let _ = child.wait();
        }
        for pid in postmaster.into_iter().chain(backends.iter().copied()) {
            kill_pid(pid);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for pid in postmaster.into_iter().chain(backends) {
            while process_alive(pid) {
                assert!(
                    Instant::now() < deadline,
                    "process {pid} of node {} survived SIGKILL",
                    self.nodes[node].name
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Starts a stopped (killed) node's Patroni again: it rejoins as a
    /// replica, rewinding its data directory with pg_rewind if it diverged.
    /// Use [`PatroniCluster::wait_ready`] to wait until it streams.
    pub fn restart_node(&mut self, node: usize) {
        assert!(
            self.nodes[node].patroni.is_none(),
            "node {} is still running",
            self.nodes[node].name
        );
        self.start_node(node);
    }

    /// A planned switchover (`POST /switchover` to the leader) to a
    /// streaming replica, in [`Mode::Sync`] to the synchronous standby.
    /// Patroni answers when the switchover is done or failed; panics on a
    /// failure. Returns `(old leader, candidate)`; the candidate is
    /// writable once [`PatroniCluster::wait_for_new_leader`] returns.
    pub fn switchover(&self) -> (usize, usize) {
        let leader = self.leader();
        let candidate = self
            .switchover_candidate(leader)
            .unwrap_or_else(|| panic!("no switchover candidate\n{}", self.diagnostics()));
        let body = format!(
            r#"{{"leader": "{}", "candidate": "{}"}}"#,
            self.nodes[leader].name, self.nodes[candidate].name
        );
        let (status, answer) = http::request(
            "POST",
            self.nodes[leader].api_port,
            "/switchover",
            Some(&body),
        )
        .unwrap_or_else(|e| panic!("POST /switchover: {e}"));
        assert_eq!(
            status,
            200,
            "switchover refused: {answer}\n{}",
            self.diagnostics()
        );
        (leader, candidate)
    }

    /// Waits until a node other than `old` is the running primary and
    /// accepts writes (`pg_is_in_recovery()` is false over a direct
    /// connection); returns it.
    pub fn wait_for_new_leader(&self, old: usize) -> usize {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        loop {
            if let Some(leader) = self.try_leader().filter(|&l| l != old) {
                if self.writable(leader) {
                    return leader;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no new leader (other than {}) within {LEADER_TIMEOUT:?}\n{}",
                self.nodes[old].name,
                self.diagnostics()
            );
            std::thread::sleep(POLL);
        }
    }

    /// Waits until one running node leads and is writable, every other
    /// running node streams from it, and (in [`Mode::Sync`], with a
    /// replica running) the `/sync` key names a synchronous standby that
    /// the leader reports as `sync`. Returns the leader.
    pub fn wait_ready(&self) -> usize {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(leader) = self.ready_leader() {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "the Patroni cluster was not ready within {READY_TIMEOUT:?}\n{}",
                self.diagnostics()
            );
            std::thread::sleep(POLL);
        }
    }

    /// A node's timeline as its Patroni reports it.
    pub fn timeline(&self, node: usize) -> Option<i64> {
        self.status(node)?.get("timeline")?.as_i64()
    }

    /// Every process the cluster consists of right now: etcd, each running
    /// node's `runuser`/Patroni, postmaster and postmaster children. For
    /// tests of the teardown.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.etcd.iter().map(Child::id).collect();
        for node in &self.nodes {
            if let Some(child) = &node.patroni {
                pids.push(child.id());
                pids.extend(children_of(child.id()));
            }
            if let Some(postmaster) = postmaster_pid(&node.data_dir) {
                pids.push(postmaster);
                pids.extend(children_of(postmaster));
            }
        }
        pids
    }

    /// Each node's state and the tails of every log, for failure messages.
    pub fn diagnostics(&self) -> String {
        let mut text = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            text.push_str(&format!(
                "--- {} (api {}, pg {}, running: {}): {}\n{}\n",
                node.name,
                node.api_port,
                node.pg_port,
                node.patroni.is_some(),
                self.status(i)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "no answer".into()),
                log_tail(&node.log, 25)
            ));
        }
        text.push_str(&format!("--- etcd\n{}\n", log_tail(&self.etcd_log, 10)));
        text
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].patroni.is_some())
    }

    fn writable(&self, node: usize) -> bool {
        #[derive(QueryableByName)]
        struct Answer {
            #[diesel(sql_type = Bool)]
            recovery: bool,
        }
        PgConnection::establish(&self.node_url(node, "postgres"))
            .ok()
            .and_then(|mut c| {
                diesel::sql_query("SELECT pg_is_in_recovery() AS recovery")
                    .get_result::<Answer>(&mut c)
                    .ok()
            })
            .is_some_and(|a| !a.recovery)
    }

    fn ready_leader(&self) -> Option<usize> {
        let leader = self.try_leader()?;
        let status = self.status(leader)?;
        let replication = status
            .get("replication")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let streaming = |name: &str| {
            replication.iter().any(|r| {
                r.get("application_name").and_then(Value::as_str) == Some(name)
                    && r.get("state").and_then(Value::as_str) == Some("streaming")
            })
        };
        let replicas: Vec<usize> = self.running().filter(|&i| i != leader).collect();
        if !replicas.iter().all(|&i| streaming(&self.nodes[i].name)) {
            return None;
        }
        if self.mode == Mode::Sync && !replicas.is_empty() {
            let sync = self.sync_standby()?;
            let reported_sync = replication.iter().any(|r| {
                r.get("application_name").and_then(Value::as_str) == Some(&self.nodes[sync].name)
                    && r.get("sync_state").and_then(Value::as_str) == Some("sync")
            });
            if !reported_sync {
                return None;
            }
        }
        self.writable(leader).then_some(leader)
    }

    /// The node `/cluster` (the `/sync` key) names synchronous standby.
    fn sync_standby(&self) -> Option<usize> {
        let view = self.cluster_view()?;
        let members = view.get("members")?.as_array()?;
        let name = members.iter().find_map(|m| {
            (m.get("role").and_then(Value::as_str) == Some("sync_standby"))
                .then(|| m.get("name").and_then(Value::as_str))
                .flatten()
        })?;
        self.nodes.iter().position(|n| n.name == name)
    }

    fn switchover_candidate(&self, leader: usize) -> Option<usize> {
        match self.mode {
            Mode::Sync => self.sync_standby().filter(|&s| s != leader),
            Mode::Async => {
                let status = self.status(leader)?;
                let replication = status.get("replication")?.as_array()?.clone();
                self.running().filter(|&i| i != leader).find(|&i| {
                    replication.iter().any(|r| {
                        r.get("application_name").and_then(Value::as_str)
                            == Some(&self.nodes[i].name)
                            && r.get("state").and_then(Value::as_str) == Some("streaming")
                    })
                })
            }
        }
    }

    fn start_etcd(&mut self, peer_port: u16) {
        let log = fs::File::create(&self.etcd_log)
            .unwrap_or_else(|e| panic!("create {}: {e}", self.etcd_log.display()));
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new("etcd")
            .arg("--name=e0")
            .arg(format!("--data-dir={}", self.root.join("etcd").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=e0={peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap_or_else(|e| panic!("etcd log: {e}")))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start etcd ({INSTALL_HINT}): {e}"));
        self.etcd = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let healthy = http::get_json(self.etcd_port, "/health")
                .and_then(|v| v.get("health").and_then(Value::as_str).map(|h| h == "true"))
                .unwrap_or(false);
            if healthy {
                return;
            }
            if let Some(Ok(Some(status))) = self.etcd.as_mut().map(Child::try_wait) {
                panic!(
                    "etcd exited with {status}\n{}",
                    log_tail(&self.etcd_log, 20)
                );
            }
            assert!(
                Instant::now() < deadline,
                "etcd not healthy within 30 s\n{}",
                log_tail(&self.etcd_log, 20)
            );
            std::thread::sleep(POLL);
        }
    }

    fn start_node(&mut self, node: usize) {
        let run_as_postgres = self.run_as_postgres;
        let node = &mut self.nodes[node];
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .unwrap_or_else(|e| panic!("open {}: {e}", node.log.display()));
        let mut command = if run_as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "patroni"]);
            c
        } else {
            Command::new("patroni")
        };
        let child = command
            .arg(&node.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap_or_else(|e| panic!("node log: {e}")))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start patroni ({INSTALL_HINT}): {e}"));
        node.patroni = Some(child);
    }

    fn config_for(&self, scope: &str, node: &Node, bin_dir: &Path) -> String {
        let sync = self.mode == Mode::Sync;
        let dir = self.root.display();
        format!(
            r#"scope: {scope}
name: {name}
restapi:
  listen: 127.0.0.1:{api}
  connect_address: 127.0.0.1:{api}
etcd3:
  hosts: 127.0.0.1:{etcd}
bootstrap:
  dcs:
    ttl: {TTL}
    loop_wait: {LOOP_WAIT}
    retry_timeout: {RETRY_TIMEOUT}
    maximum_lag_on_failover: 1073741824
    synchronous_mode: {sync}
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: "on"
        max_connections: 60
        shared_buffers: 16MB
  initdb:
    - encoding: UTF8
    - data-checksums
    - auth: trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {dir}/{name}.pgpass
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: {dir}
"#,
            name = node.name,
            api = node.api_port,
            etcd = self.etcd_port,
            pg = node.pg_port,
            data = node.data_dir.display(),
            bin = bin_dir.display(),
        )
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            let postmaster = postmaster_pid(&self.nodes[i].data_dir);
            let backends = postmaster.map(children_of).unwrap_or_default();
            if let Some(mut child) = self.nodes[i].patroni.take() {
                kill_group(child.id());
                let _ = child.wait();
            }
            for pid in postmaster.into_iter().chain(backends) {
                kill_pid(pid);
            }
        }
        if let Some(mut etcd) = self.etcd.take() {
            kill_group(etcd.id());
            let _ = etcd.wait();
        }
        if std::env::var_os("LEASEHOLD_KEEP_PATRONI").is_none() {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

fn is_running_primary(status: &Value) -> bool {
    matches!(
        status.get("role").and_then(Value::as_str),
        Some("master" | "primary")
    ) && status.get("state").and_then(Value::as_str) == Some("running")
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}

/// `LEASEHOLD_PG_BIN`, else the newest `/usr/lib/postgresql/<major>/bin`.
fn postgres_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(leasehold_local::BIN_DIR_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("pg_ctl").is_file().then_some((major, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server binaries under /usr/lib/postgresql (set {} or apt-get install postgresql)",
            leasehold_local::BIN_DIR_ENV
        )
    })
}

fn unique_dir() -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "leasehold-patroni-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ))
}

/// `count` distinct free loopback ports (all bound at once, then released).
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| {
            TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("find a free port: {e}"))
        })
        .collect();
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .unwrap_or_else(|e| panic!("local address: {e}"))
                .port()
        })
        .collect()
}

fn chown_to_postgres(dir: &Path) {
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(dir)
        .status()
        .unwrap_or_else(|e| panic!("chown {}: {e}", dir.display()));
    assert!(
        status.success(),
        "chown -R postgres {} failed",
        dir.display()
    );
    let mut perms = fs::metadata(dir)
        .unwrap_or_else(|e| panic!("stat {}: {e}", dir.display()))
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o700);
    fs::set_permissions(dir, perms).unwrap_or_else(|e| panic!("chmod {}: {e}", dir.display()));
}

fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The postmaster's pid from `postmaster.pid`, if that process is alive.
fn postmaster_pid(data_dir: &Path) -> Option<u32> {
    let text = fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    let pid: u32 = text.lines().next()?.trim().parse().ok()?;
    process_alive(pid).then_some(pid)
}

/// Direct children of `pid` (a postmaster's backends and auxiliary
/// processes: each runs in a session of its own, so a process-group kill
/// would miss them).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_string_lossy().parse().ok()?;
            let stat = fs::read_to_string(entry.path().join("stat")).ok()?;
            // "pid (comm) state ppid ...": comm may contain spaces.
            let after = stat.rsplit_once(')')?.1;
            let ppid: u32 = after.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

/// Whether `pid` is a live process (not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie is dead for our purposes.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn kill_pid(pid: u32) {
    signal(pid, libc::SIGKILL);
}

/// Best effort: the process may be gone already.
fn signal(pid: u32, signal: libc::c_int) {
    let _ = crate::process::send_signal(pid, signal);
}

/// SIGKILLs the process group led by `pid` (started with
/// `process_group(0)`); best effort.
fn kill_group(pid: u32) {
    let _ = crate::process::signal_group(pid, libc::SIGKILL);
}

fn log_tail(path: &Path, lines: usize) -> String {
    match fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => String::new(),
        Err(error) => format!("(cannot read {}: {error})", path.display()),
    }
}
