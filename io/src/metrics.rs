//! Prometheus metrics, served on an opt-in address (loopback unless an
//! operator says otherwise) at `/metrics`, in the OpenMetrics text format,
//! and clustered mode's status as text at `/cluster` (`cluster status`).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use skippr_core::RaftStatus;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use tracing::{info, warn};

type Labels = Vec<(String, String)>;

/// Every metric the daemon exports. Handles are cheap clones over atomics.
pub struct Metrics {
    registry: Registry,
    pub commits: Counter,
    pub commit_seconds: Histogram,
    /// From a source read to the ack that covers it (commit visible).
    pub ack_seconds: Histogram,
    pub wal_bytes_written: Counter,
    pub records: Counter,
    pub compactions: Family<Labels, Counter>,
    /// Records a sink refused whose refusal committed, by stream and
    /// reason class (`reason_class`).
    pub dead_letters: Family<Labels, Counter>,
    pub recovery_seconds: Gauge<f64, AtomicU64>,
    pub compaction_lag: Family<Labels, Gauge>,
    wal_bytes: Gauge,
    /// 1 while WAL (or lease) requests have failed past the stall report
    /// time without one success, else 0.
    pub stalled: Gauge,
    /// 1 while the WAL is at its size limit and sources are paused, else 0.
    pub wal_full: Gauge,
    /// Committed record bytes held for sinks: in memory, and in all (the
    /// rest is read back from the WAL).
    pub records_cached_bytes: Gauge,
    pub records_held_bytes: Gauge,
    /// Clustered mode: this host's raft term, and 1 while it leads.
    raft_term: Gauge,
    raft_is_leader: Gauge,
    /// 1 while no leader with a majority has been known for the stall time.
    pub raft_no_quorum: Gauge,
    raft_commit_index: Gauge,
    raft_leader: Gauge,
    raft_peer_match_index: Family<Labels, Gauge>,
    raft_peer_lag: Family<Labels, Gauge>,
    /// The last raft status, for `/cluster`.
    raft: Mutex<Option<RaftStatus>>,
    /// The disk WAL's directory; `None` in S3 mode, where the size is not
    /// measured.
    wal_dir: Option<PathBuf>,
}

impl Metrics {
    pub fn new(wal_dir: Option<PathBuf>) -> Metrics {
        let mut registry = Registry::with_prefix("skippr");
        let commits = Counter::default();
        let commit_seconds = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        let ack_seconds = Histogram::new(exponential_buckets(0.000_1, 2.0, 18));
        let wal_bytes_written = Counter::default();
        let records = Counter::default();
        let compactions = Family::<Labels, Counter>::default();
        let dead_letters = Family::<Labels, Counter>::default();
        registry.register(
            "dead_letters",
            "Records a sink refused, sent to the dead letters (the refusal committed to the WAL), by stream and reason \
             class (a reason's text before its first ':')",
            dead_letters.clone(),
        );
        let recovery_seconds = Gauge::<f64, AtomicU64>::default();
        let compaction_lag = Family::<Labels, Gauge>::default();
        let wal_bytes = Gauge::default();
        let stalled = Gauge::default();
        let wal_full = Gauge::default();
        let records_cached_bytes = Gauge::default();
        let records_held_bytes = Gauge::default();
        let (raft_term, raft_is_leader, raft_no_quorum) = (Gauge::default(), Gauge::default(), Gauge::default());
        registry.register(
            "raft_no_quorum",
            "Clustered mode: 1 while no leader with a majority has been known for SKIPPR_STALL_SECONDS",
            raft_no_quorum.clone(),
        );
        registry.register("raft_term", "Clustered mode: this host's raft term", raft_term.clone());
        let (raft_commit_index, raft_leader) = (Gauge::default(), Gauge::default());
        let (raft_peer_match_index, raft_peer_lag) = (Family::<Labels, Gauge>::default(), Family::default());
        registry.register(
            "raft_commit_index",
            "Clustered mode: this host's raft commit index",
            raft_commit_index.clone(),
        );
        registry.register(
            "raft_leader",
            "Clustered mode: the node id of the leader this host knows of (0: none)",
            raft_leader.clone(),
        );
        registry.register(
            "raft_peer_match_index",
            "Clustered mode, on the leader: the index through which each other member's log matches the leader's",
            raft_peer_match_index.clone(),
        );
        registry.register(
            "raft_peer_lag",
            "Clustered mode, on the leader: how many entries each other member's log is behind the leader's",
            raft_peer_lag.clone(),
        );
        registry.register(
            "raft_is_leader",
            "Clustered mode: 1 while this host leads the cluster",
            raft_is_leader.clone(),
        );
        registry.register(
            "wal_full",
            "1 while the WAL is at its size limit (WAL_MAX_BYTES) and sources are paused",
            wal_full.clone(),
        );
        registry.register(
            "records_cached_bytes",
            "Committed record bytes kept in memory for sinks (at most SKIPPR_RECORD_CACHE_BYTES)",
            records_cached_bytes.clone(),
        );
        registry.register(
            "records_held_bytes",
            "Committed record bytes not yet acknowledged by every sink, in memory or only in the WAL",
            records_held_bytes.clone(),
        );
        registry.register(
            "wal_stalled",
            "1 while WAL or lease requests have failed for the stall time without one success",
            stalled.clone(),
        );
        registry.register("commits", "Commit groups made durable", commits.clone());
        registry.register("commit_seconds", "Time to make one commit group durable", commit_seconds.clone());
        registry.register(
            "ack_seconds",
            "Time from a source batch's read to its ack: its commit group visible (durable on a majority in clustered mode)",
            ack_seconds.clone(),
        );
        registry.register("wal_written_bytes", "Bytes of commit groups written", wal_bytes_written.clone());
        registry.register("records", "Records read from sources", records.clone());
        registry.register("compactions", "Sink answers to destination batches, by outcome", compactions.clone());
        registry.register("recovery_seconds", "How long the last recovery took", recovery_seconds.clone());
        registry.register(
            "compaction_lag",
            "Committed positions not yet acknowledged, per sink and stream",
            compaction_lag.clone(),
        );
        registry.register("wal_bytes", "Bytes of WAL segment files on disk", wal_bytes.clone());
        Metrics {
            registry,
            commits,
            commit_seconds,
            ack_seconds,
            wal_bytes_written,
            records,
            compactions,
            dead_letters,
            recovery_seconds,
            compaction_lag,
            wal_bytes,
            stalled,
            wal_full,
            records_cached_bytes,
            records_held_bytes,
            raft_term,
            raft_is_leader,
            raft_no_quorum,
            raft_commit_index,
            raft_leader,
            raft_peer_match_index,
            raft_peer_lag,
            raft: Mutex::new(None),
            wal_dir,
        }
    }

    /// Clustered mode: what the engine knows of the cluster now.
    pub fn set_raft(&self, status: &RaftStatus) {
        self.raft_term.set(status.term as i64);
        self.raft_is_leader.set(status.is_leader as i64);
        self.raft_leader.set(status.leader as i64);
        self.raft_commit_index.set(status.commit as i64);
        self.raft_peer_match_index.clear();
        self.raft_peer_lag.clear();
        for p in &status.peers {
            let labels = vec![("peer".to_string(), p.node.to_string())];
            self.raft_peer_match_index.get_or_create(&labels).set(p.matched as i64);
            self.raft_peer_lag.get_or_create(&labels).set(status.last_index.saturating_sub(p.matched) as i64);
        }
        *self.raft.lock().expect("not poisoned") = Some(status.clone());
    }

    /// `/cluster`: the raft status as text, one line for this host and one
    /// per other member (on the leader); `None` outside clustered mode.
    pub fn render_cluster(&self) -> Option<String> {
        let s = self.raft.lock().expect("not poisoned").clone()?;
        let role = match (s.is_leader, s.leader) {
            (true, _) => "leader".to_string(),
            (false, 0) => "no leader known".to_string(),
            (false, l) => format!("follower of node {l}"),
        };
        let mut out = format!(
            "node {}: {role}, term {}, commit index {}, last index {}\n",
            s.node, s.term, s.commit, s.last_index
        );
        for p in &s.peers {
            let lag = s.last_index.saturating_sub(p.matched);
            out.push_str(&format!(
                "peer {}: match index {}, lag {lag} entries, commit index it reported {}\n",
                p.node, p.matched, p.committed
            ));
        }
        if !s.is_leader {
            out.push_str("(each peer's match index and lag: ask the leader)\n");
        }
        Some(out)
    }

    /// The text exposition, with the WAL's size measured now.
    pub fn render(&self) -> String {
        if let Some(dir) = &self.wal_dir {
            let size = std::fs::read_dir(dir)
                .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum::<u64>())
                .unwrap_or(0);
            self.wal_bytes.set(size as i64);
        }
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("encoding to a String does not fail");
        out
    }
}

/// Serves `/metrics` on `addr` from a plain thread.
pub fn serve(metrics: Arc<Metrics>, addr: SocketAddr) -> std::io::Result<()> {
    let server = tiny_http::Server::http(addr).map_err(std::io::Error::other)?;
    info!(%addr, "metrics at http://{addr}/metrics");
    std::thread::Builder::new().name("metrics".into()).spawn(move || {
        for request in server.incoming_requests() {
            let cluster = (request.url() == "/cluster").then(|| metrics.render_cluster());
            let response = if let Some(status) = cluster {
                match status {
                    Some(text) => tiny_http::Response::from_string(text),
                    None => tiny_http::Response::from_string("not in clustered mode\n").with_status_code(404),
                }
            } else if request.url() == "/metrics" {
                let header = tiny_http::Header::from_bytes(
                    &b"Content-Type"[..],
                    &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
                )
                .expect("a valid header");
                tiny_http::Response::from_string(metrics.render()).with_header(header)
            } else {
                tiny_http::Response::from_string("not found; try /metrics or /cluster\n").with_status_code(404)
            };
            if let Err(e) = request.respond(response) {
                warn!(error = %e, "answering a metrics request failed");
            }
        }
    })?;
    Ok(())
}

/// A refusal reason's class, for a metric label: its text before the first
/// `:` (sinks put a stable class there, such as `SQLSTATE 22P02`), at most 64
/// characters, so record values never become label values.
pub fn reason_class(reason: &str) -> String {
    reason.split(':').next().unwrap_or_default().trim().chars().take(64).collect()
}
