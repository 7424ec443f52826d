//! Three `skipprd run` processes on loopback ports, clustered: separate
//! DATA_DIRs, one shared directory sink, certificates from `skipprd cluster
//! certs`. Each process logs to its own file; the leader is found from the
//! metrics each serves (`skippr_raft_is_leader`, `skippr_raft_term`).

use crate::{scrape_metrics, skipprd, skipprd_bin, stderr, stdout};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Cluster {
    pub root: PathBuf,
    /// Each host's DATA_DIR, node 1 first.
    data: Vec<PathBuf>,
    /// The cluster's id, as `cluster init` printed it.
    pub id: String,
    pub sink: PathBuf,
    peer_ports: Vec<u16>,
    metrics_ports: Vec<u16>,
    /// Arguments every host runs with besides the cluster's own.
    args: Vec<String>,
    env: Vec<(String, String)>,
    children: Vec<Option<Child>>,
}

use crate::free_port;

impl Cluster {
    /// Certificates and three initialized DATA_DIRs under `root`; nothing
    /// runs yet.
    pub fn new(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Cluster {
        let data: Vec<PathBuf> = (1..=3).map(|n| root.join(format!("d{n}"))).collect();
        Cluster::with_data_dirs(root, &data, args, env)
    }

    /// As `new`, with the three hosts' DATA_DIRs at `data` (on mounts of
    /// their own, say).
    pub fn with_data_dirs(root: &Path, data: &[PathBuf], args: &[&str], env: &[(&str, &str)]) -> Cluster {
        assert_eq!(data.len(), 3, "three hosts");
        let certs = root.join("certs");
        let out = skipprd(&["cluster", "certs", "--dir", certs.to_str().unwrap(), "--nodes", "1,2,3"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        // Node 4 is for a host that joins in place of one whose data is
        // gone: issued later, by the same CA, as an operator would.
        let out = skipprd(&["cluster", "certs", "--dir", certs.to_str().unwrap(), "--nodes", "4"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let again = skipprd(&["cluster", "certs", "--dir", certs.to_str().unwrap(), "--nodes", "4"]);
        assert!(stderr(&again).contains("nothing is overwritten"), "{}", stderr(&again));
        let init = |node: u64, id: Option<&str>| {
            let data = &data[node as usize - 1];
            let mut a =
                vec!["cluster", "init", "--node-id", "", "--voters", "1,2,3", "--wal-bytes-per-file", "4194304"];
            let node_s = node.to_string();
            a[3] = &node_s;
            if let Some(id) = id {
                a.extend(["--cluster-id", id]);
            }
            a.push(data.to_str().unwrap());
            let out = skipprd(&a);
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            stdout(&out).split_whitespace().nth(1).unwrap().trim_end_matches(':').to_string()
        };
        let id = init(1, None);
        init(2, Some(&id));
        init(3, Some(&id));
        Cluster {
            id,
            root: root.to_path_buf(),
            data: data.to_vec(),
            sink: root.join("sink"),
            peer_ports: (0..3).map(|_| free_port()).collect(),
            metrics_ports: (0..3).map(|_| free_port()).collect(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            children: vec![None, None, None],
        }
    }

    /// Node 4 from now on, in every host's SKIPPR_CLUSTER_PEERS (hosts
    /// running now learn of it when they are started again): its DATA_DIR
    /// prepared by `cluster join` in place of node `replaces`.
    pub fn join(&mut self, replaces: u64) {
        let data = self.root.join("d4");
        self.data.push(data.clone());
        let replaces = replaces.to_string();
        let args = [
            "cluster",
            "join",
            "--node-id",
            "4",
            "--voters",
            "1,2,3",
            "--cluster-id",
            &self.id,
            "--replaces",
            &replaces,
            "--wal-bytes-per-file",
            "4194304",
            data.to_str().unwrap(),
        ];
        let out = skipprd(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        self.peer_ports.push(free_port());
        self.metrics_ports.push(free_port());
        self.children.push(None);
    }

    /// Sets (or with `None` removes) an environment variable for every host
    /// started from now on.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_string(), v.to_string()));
        }
    }

    pub fn peers(&self) -> String {
        let entries: Vec<String> =
            self.peer_ports.iter().enumerate().map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1)).collect();
        entries.join(",")
    }

    pub fn metrics_port(&self, node: u64) -> u16 {
        self.metrics_ports[node as usize - 1]
    }

    /// Host `node`'s DATA_DIR.
    pub fn data(&self, node: u64) -> &Path {
        &self.data[node as usize - 1]
    }

    pub fn log(&self, node: u64) -> PathBuf {
        self.root.join(format!("log{node}"))
    }

    /// The command that runs host `node`.
    pub fn command(&self, node: u64) -> Command {
        let certs = self.root.join("certs");
        let mut c = Command::new(skipprd_bin());
        c.arg("run")
            .args(&self.args)
            .env("WAL_STORAGE", "clustered")
            .env("DATA_DIR", self.data(node))
            .env("SKIPPR_CLUSTER_NODE_ID", node.to_string())
            .env("SKIPPR_CLUSTER_PEERS", self.peers())
            .env("SKIPPR_CLUSTER_CA", certs.join("ca.pem"))
            .env("SKIPPR_CLUSTER_CERT", certs.join(format!("node-{node}.pem")))
            .env("SKIPPR_CLUSTER_KEY", certs.join(format!("node-{node}-key.pem")))
            .env("SKIPPR_METRICS_ADDR", self.metrics_ports[node as usize - 1].to_string())
            .args(["--sink-dir", self.sink.to_str().unwrap(), "--wal-bytes-per-file", "4194304"]);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    pub fn start(&mut self, node: u64) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log(node)).unwrap();
        let child = self.command(node).stdout(log.try_clone().unwrap()).stderr(log).stdin(Stdio::null()).spawn();
        self.children[node as usize - 1] = Some(child.unwrap());
    }

    pub fn start_all(&mut self) {
        for n in 1..=3 {
            self.start(n);
        }
    }

    pub fn pid(&self, node: u64) -> Pid {
        Pid::from_raw(self.children[node as usize - 1].as_ref().expect("running").id() as i32)
    }

    pub fn signal(&self, node: u64, signal: Signal) {
        kill(self.pid(node), signal).unwrap();
    }

    /// SIGKILLs host `node` and reaps it.
    pub fn kill(&mut self, node: u64) {
        self.signal(node, Signal::SIGKILL);
        let mut child = self.children[node as usize - 1].take().unwrap();
        child.wait().unwrap();
    }

    /// SIGTERMs host `node` and returns its exit code.
    pub fn stop(&mut self, node: u64, limit: Duration) -> Option<i32> {
        self.signal(node, Signal::SIGTERM);
        self.exit_code(node, limit, &format!("stop within {limit:?} of SIGTERM"))
    }

    /// Waits for host `node` to exit by itself and returns its exit code.
    pub fn wait(&mut self, node: u64, limit: Duration) -> Option<i32> {
        self.exit_code(node, limit, &format!("exit by itself within {limit:?}"))
    }

    /// Host `node`'s exit code if it has exited (reaped then), `None`
    /// while it runs.
    pub fn exited(&mut self, node: u64) -> Option<Option<i32>> {
        let child = self.children[node as usize - 1].as_mut()?;
        let status = child.try_wait().unwrap()?;
        self.children[node as usize - 1] = None;
        Some(status.code())
    }

    /// Reaps host `node` within `limit`, or kills it and panics saying it
    /// did not `what`.
    fn exit_code(&mut self, node: u64, limit: Duration, what: &str) -> Option<i32> {
        let mut child = self.children[node as usize - 1].take().expect("running");
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > until {
                let _ = child.kill();
                let _ = child.wait();
                panic!("host {node} did not {what}: {}", self.tail(node));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// (term, is leader) as host `node` reports it, while it answers.
    pub fn role(&self, node: u64) -> Option<(u64, bool)> {
        let page = scrape_metrics(self.metrics_ports[node as usize - 1]);
        let value =
            |name: &str| page.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<u64>().ok()));
        Some((value("skippr_raft_term ")?, value("skippr_raft_is_leader ")? == 1))
    }

    /// The running host that leads in the highest term, waiting for one.
    pub fn leader(&self, limit: Duration) -> u64 {
        let until = Instant::now() + limit;
        loop {
            let leader = (1..=self.children.len() as u64)
                .filter(|n| self.children[*n as usize - 1].is_some())
                .filter_map(|n| self.role(n).map(|(term, leads)| (term, leads, n)))
                .filter(|(_, leads, _)| *leads)
                .max();
            if let Some((_, _, n)) = leader {
                return n;
            }
            assert!(Instant::now() < until, "no leader within {limit:?}: {}", self.tail(1));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of host `node`'s log.
    pub fn tail(&self, node: u64) -> String {
        let text = std::fs::read_to_string(self.log(node)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
