//! The one event loop. It waits on the engine's next deadline, on I/O
//! completions and on the shutdown signal; feeds one input; drains every
//! output, starting each request on a blocking thread and sending its
//! completion back by `IoId`. It makes no decisions: every policy is in core.

use crate::ack_latency::AckLatency;
use crate::clock::Clock;
use crate::disk_wal::DiskWal;
use crate::dynamo::Dynamo;
use crate::metrics::Metrics;
use crate::offsets_db::OffsetsDb;
use crate::peer::{Incoming, Peers};
use crate::plugin::{Batch, SchemaPlugin, Sink, Source};
use crate::s3_wal::S3Wal;
use skippr_core::cluster::JoinRefusal;
use skippr_core::{Host, IoError, IoId, Position, SinkOutcome, StopRecordUse, StreamId};
use skippr_core::{
    Input, IntakeFault, IoOp, IoReply, LeaseOp, OffsetsOp, Output, PluginOp, SourceBatchIn, Stall, StopReason, WalOp,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

pub type SharedSource = Arc<Mutex<Box<dyn Source>>>;
pub type SharedSink = Arc<Mutex<Box<dyn Sink>>>;
pub type SharedSchema = Arc<Mutex<Box<dyn SchemaPlugin>>>;

/// Where the WAL lives.
#[derive(Clone)]
pub enum WalBackend {
    Disk(Arc<DiskWal>),
    S3(Arc<S3Wal>),
}

/// Where offsets are materialized.
#[derive(Clone)]
pub enum OffsetsBackend {
    Disk(Arc<OffsetsDb>),
    Dynamo(Arc<Dynamo>),
}

/// What the engine's requests are performed against.
pub struct Backends {
    pub wal: WalBackend,
    pub offsets: OffsetsBackend,
    /// The writer lease's table (S3 mode).
    pub lease: Option<Arc<Dynamo>>,
    pub sources: Vec<SharedSource>,
    pub sinks: Vec<SharedSink>,
    /// Where refused records go (`--dead-letter`), if anywhere.
    pub dead_letters: Option<SharedSink>,
    /// The declared streams by id and by name, built once at start.
    pub streams: Arc<StreamNames>,
    /// Sink names by `SinkId`.
    pub sink_names: Vec<String>,
    /// The schema plugin, if one is configured.
    pub schema: Option<SharedSchema>,
    pub metrics: Arc<Metrics>,
    /// Where the WAL is, and which endpoints serve it, for the stall report.
    pub place: String,
    pub endpoints: String,
    /// Clustered mode: the peer transport (the WAL is on disk).
    pub peers: Option<Arc<Peers>>,
    /// The largest record a source may send (`--record-bytes-max`).
    pub record_bytes_max: u64,
    /// Per source, the input an operator gave up this run, as the engine
    /// opened it: `(partition, at, next)`. The intake rules pass over it
    /// (the engine drops it).
    pub skips: Mutex<BTreeMap<u16, Vec<Skip>>>,
}

/// The streams a source declared, by `StreamId` and by name: a batch's
/// stream is resolved once per batch by lookup, never searched for.
pub struct StreamNames {
    names: Vec<String>,
    ids: BTreeMap<String, StreamId>,
}

impl StreamNames {
    pub fn new(names: Vec<String>) -> StreamNames {
        let ids = names.iter().enumerate().map(|(i, n)| (n.clone(), StreamId(i as u16))).collect();
        StreamNames { names, ids }
    }

    pub fn name(&self, id: StreamId) -> &str {
        &self.names[id.0 as usize]
    }

    pub fn id(&self, name: &str) -> Option<StreamId> {
        self.ids.get(name).copied()
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// An operator's skip: partition, and the positions it starts and ends at.
pub type Skip = (u32, Position, Position);

/// How long a snapshot's copy may go without a chunk before it fails.
const SNAPSHOT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Counts for the run's summary line.
#[derive(Default)]
pub struct RunTotals {
    pub records: AtomicU64,
    pub commits: AtomicU64,
    pub compactions: AtomicU64,
    /// Bytes of commit groups appended.
    pub wal_bytes: AtomicU64,
    /// SIGTERM or SIGINT arrived (clustered mode restarts a deposed engine
    /// only when it did not).
    pub shutdown: AtomicBool,
    /// How long sources waited for their acks.
    pub acks: AckLatency,
}

type Completion = (IoId, Result<IoReply, IoError>);

/// Runs the engine until it stops. `shutdown` delivers SIGTERM/SIGINT;
/// `peers` what the cluster's other hosts send (clustered mode).
pub async fn drive(
    mut host: Host,
    backends: Backends,
    clock: Clock,
    shutdown: &mut mpsc::Receiver<()>,
    mut peers: Option<&mut mpsc::Receiver<Incoming>>,
    totals: Arc<RunTotals>,
) -> StopReason {
    let (tx, mut rx) = mpsc::unbounded_channel::<Completion>();
    let backends = Arc::new(backends);
    // A stall an earlier engine of this process reported is its own: this
    // one reports its own.
    backends.metrics.stalled.set(0);
    backends.metrics.raft_no_quorum.set(0);
    totals.acks.forget_pending();
    let mut shutdown_open = !totals.shutdown.load(Ordering::Relaxed);
    let mut raft_seen = None;
    let mut role_seen: Option<(u64, u64, bool)> = None;
    if !shutdown_open {
        host.handle(clock.now(), Input::Shutdown);
    }
    loop {
        while let Some(output) = host.poll_output() {
            match output {
                Output::Io { id, op } => start(id, op, &backends, &tx, &totals),
                Output::Recovered(s) => {
                    backends.metrics.recovery_seconds.set(clock.now().as_micros() as f64 / 1e6);
                    let stop_record = stop_record_use(s.stop_record);
                    info!(
                        stop_record,
                        segments = s.segments,
                        leftovers_deleted = s.leftovers,
                        next_lsn = s.next_lsn.0,
                        partitions = s.partitions,
                        open_compactions = s.open_compactions,
                        scanned_bytes = s.scanned_bytes,
                        scan_seconds = s.scan_time.as_micros() as f64 / 1e6,
                        "recovered"
                    )
                }
                Output::LogRestored(r) => info!(
                    stop_record = stop_record_use(r.stop_record),
                    scanned_bytes = r.scanned_bytes,
                    scan_seconds = r.scan_time.as_micros() as f64 / 1e6,
                    commit = r.commit,
                    last_index = r.last_index,
                    uncommitted_bytes = r.uncommitted_bytes,
                    "restored raft's log from this host's disk"
                ),
                Output::Refused { sink, stream, seq, letters, reasons } => {
                    let stream = backends.streams.name(stream).to_string();
                    let mut classes = BTreeMap::<String, u64>::new();
                    for r in &reasons {
                        *classes.entry(crate::metrics::reason_class(r)).or_default() += 1;
                    }
                    for (class, n) in &classes {
                        let labels = vec![("stream".into(), stream.clone()), ("reason".into(), class.clone())];
                        backends.metrics.dead_letters.get_or_create(&labels).inc_by(*n);
                    }
                    warn!(
                        sink = backends.sink_names[sink.0 as usize],
                        stream,
                        seq = seq.0,
                        dead_letter_batch = letters.0,
                        refused = reasons.len(),
                        first_reason = reasons.first().map(String::as_str).unwrap_or_default(),
                        "records of a batch were refused (by the sink, or at intake): they go to the dead letters (the \
                         decision is in the WAL), the rest to the sink"
                    );
                }
                // One line per level of the halving: the dead letter it
                // ends in has its WARN line.
                Output::TailCut { source, partition, kept } => warn!(
                    source = source.0,
                    partition,
                    kept,
                    "a Singer tap's window closed with more records under its last replication-key value than the \
                     bookmark rule keeps: when the tap resumes inclusively, those past the ones kept come again and \
                     reach the sink twice unless it upserts by key (a bulk load under one timestamp; README, the \
                     bookmark rule)"
                ),
                Output::Split { sink, stream, seq, id } => info!(
                    sink = backends.sink_names[sink.0 as usize],
                    stream = backends.streams.name(stream),
                    seq = seq.0,
                    compaction_id = %id,
                    "the sink answered fatal for a batch and names no record it cannot take (protocol version 1): \
                     the batch is cut to its first half to find it (the split is in the WAL), the rest follows \
                     as the next batch"
                ),
                Output::Skip { key, at, next, position, recorded } => {
                    let (partition, at, next) = (key.partition, at.0, next.0);
                    if recorded {
                        warn!(partition, at, next, "giving up input on the operator's command (recorded in the WAL)");
                    } else {
                        info!(
                            partition,
                            at,
                            next,
                            position = position.0,
                            "nothing to skip: the partition is past that input already (an earlier run skipped it)"
                        );
                    }
                }
                Output::BatchSkip { sink, stream, seq, recorded } => {
                    let stream = backends.streams.name(stream).to_string();
                    let sink = backends.sink_names.get(sink.0 as usize).cloned().unwrap_or_default();
                    if recorded {
                        warn!(
                            sink,
                            stream,
                            seq = seq.0,
                            "giving up a batch on the operator's command (recorded in the WAL)"
                        );
                    } else {
                        info!(
                            sink,
                            stream,
                            seq = seq.0,
                            "nothing to skip: that batch is done already (an earlier run applied it or gave it up)"
                        );
                    }
                }
                Output::Stalled { what: Stall::RaftNoPeer, for_ } => {
                    error!(
                        last_error = %crate::health::last_warning().unwrap_or_else(|| "none logged".into()),
                        "no peer has sent this host a message for {:.0} s, so no raft leader with a majority is known: \
                         nothing more is acknowledged until a majority of the cluster's hosts run and reach each other \
                         (nothing committed is lost); check that the other hosts run, SKIPPR_CLUSTER_PEERS and the \
                         network between them (a host whose id was removed from the cluster is told so, and stops, \
                         as soon as a peer hears from it)",
                        for_.as_micros() as f64 / 1e6
                    );
                    backends.metrics.stalled.set(1);
                    backends.metrics.raft_no_quorum.set(1);
                }
                Output::Stalled { what: Stall::RaftQuorum, for_ } => {
                    error!(
                        last_error = %crate::health::last_warning().unwrap_or_else(|| "none logged".into()),
                        "no raft leader with a majority for {:.0} s: nothing more is acknowledged until a majority of \
                         the cluster's hosts run and reach each other (nothing committed is lost); check the other \
                         hosts, SKIPPR_CLUSTER_PEERS and the network between them",
                        for_.as_micros() as f64 / 1e6
                    );
                    // The gauges change after the log line: whoever sees them
                    // change finds the line written.
                    backends.metrics.stalled.set(1);
                    backends.metrics.raft_no_quorum.set(1);
                }
                Output::Stalled { what, for_ } => {
                    backends.metrics.stalled.set(1);
                    let last = crate::health::last_warning().unwrap_or_else(|| "none logged".into());
                    error!(
                        wal = %backends.place,
                        endpoints = %backends.endpoints,
                        last_error = %last,
                        "the {what} has made no progress for {:.0} s: every request failed (retrying, nothing \
                         committed is lost); check that the endpoint is up and reachable",
                        for_.as_micros() as f64 / 1e6
                    );
                }
                Output::Unstalled if backends.peers.is_some() => {
                    info!("a raft leader with a majority again: the pipeline makes progress");
                    backends.metrics.stalled.set(0);
                    backends.metrics.raft_no_quorum.set(0);
                }
                Output::Unstalled => {
                    backends.metrics.stalled.set(0);
                    info!(wal = %backends.place, "the WAL makes progress again");
                }
                Output::WalFull { bytes, limit } => {
                    backends.metrics.wal_full.set(1);
                    warn!(
                        wal = %backends.place,
                        bytes,
                        limit,
                        "the WAL reached its size limit (WAL_MAX_BYTES): sources are paused until sinks catch up and \
                         old segments are deleted; nothing is lost. Check the sinks, or raise the limit"
                    );
                }
                Output::WalRoom { bytes } => {
                    backends.metrics.wal_full.set(0);
                    info!(wal = %backends.place, bytes, "the WAL is below its size limit again; sources resume");
                }
                Output::Stopped(reason) => return reason,
                Output::Send(m) => match &backends.peers {
                    Some(peers) => peers.send(&m),
                    None => unreachable!("only clustered engines send raft messages"),
                },
                Output::TellRemoved { to } => match &backends.peers {
                    Some(peers) => {
                        debug!(node = to, "a message from node {to}, removed from the cluster: telling it so");
                        peers.tell_removed(to)
                    }
                    None => unreachable!("only clustered engines hear from peers"),
                },
                Output::Role { term, leader, is_leader } => {
                    let why = role_change_reason(role_seen, (term, leader, is_leader));
                    role_seen = Some((term, leader, is_leader));
                    match (is_leader, leader) {
                        (true, _) => info!(term, reason = why, "this host leads the cluster"),
                        (false, 0) => info!(term, reason = why, "no leader known"),
                        (false, leader) => info!(term, leader, reason = why, "following node {leader}"),
                    }
                }
                // A joining host asks every peer; only the leader acts.
                Output::JoinRefused { node, why: JoinRefusal::NotLeader } => {
                    debug!(node, "node {node} asked to join; this host does not lead")
                }
                Output::JoinRefused { node, why } => warn!(node, "refused node {node}'s request to join: {why}"),
                Output::LeaseWait { holder, generation } => info!(
                    holder = format!("{holder:016x}"),
                    generation,
                    "another writer holds the WAL's lease; waiting for it to release it or stop renewing it"
                ),
            }
        }
        if let Some(status) = host.raft_status().filter(|s| Some(s) != raft_seen.as_ref()) {
            backends.metrics.set_raft(&status);
            raft_seen = Some(status);
        }
        let (cached, held) = host.record_bytes();
        backends.metrics.records_cached_bytes.set(cached as i64);
        backends.metrics.records_held_bytes.set(held as i64);
        for (sink, stream, lag) in host.compaction_lag() {
            let labels = vec![
                ("sink".to_string(), backends.sink_names[sink.0 as usize].clone()),
                ("stream".to_string(), backends.streams.name(stream).to_string()),
            ];
            backends.metrics.compaction_lag.get_or_create(&labels).set(lag as i64);
        }
        let deadline = host.poll_timeout();
        let sleep = deadline.map(|(at, _)| tokio::time::Instant::from_std(clock.to_std(at)));
        let peer_input = async {
            match peers.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some((id, result)) = rx.recv() => host.handle(clock.now(), Input::IoDone { id, result }),
            Some(incoming) = peer_input => {
                let input = match incoming {
                    Incoming::Raft(m) => Input::Peer(m),
                    Incoming::Served { to, ok } => Input::SnapshotServed { to, ok },
                    Incoming::Join { node, replaces } => Input::Join { node, replaces },
                    Incoming::Removed { by, node } => Input::Removed { by, node },
                };
                host.handle(clock.now(), input)
            }
            _ = async { tokio::time::sleep_until(sleep.expect("guarded")).await }, if sleep.is_some() => {
                host.handle(clock.now(), Input::Timeout)
            }
            signal = shutdown.recv(), if shutdown_open => {
                shutdown_open = false;
                if signal.is_some() {
                    totals.shutdown.store(true, Ordering::Relaxed);
                    info!("shutdown requested: draining");
                    if host.raft_status().is_some_and(|s| s.is_leader) {
                        // It stops once another host leads: said here, since
                        // the wait can be seconds when the others stop too.
                        info!(
                            "this host leads the cluster: it stops once it has handed leadership to a caught-up \
                             voter, or after two election timeouts (about 2 s) if none takes it"
                        );
                    }
                    host.handle(clock.now(), Input::Shutdown);
                }
            }
        }
    }
}

/// Why the role changed from `before` to `now` (term, leader, is leader),
/// as far as the two tell.
fn role_change_reason(before: Option<(u64, u64, bool)>, now: (u64, u64, bool)) -> &'static str {
    let Some((term0, leader0, led)) = before else { return "this engine started" };
    let (term, leader, leads) = now;
    match (led, leads, leader) {
        (_, true, _) => "this host won the election",
        (true, false, _) if term > term0 => "another host started a newer term",
        (true, false, _) => "no majority answered within the election timeout",
        (false, false, 0) if leader0 != 0 => "no word from the leader within the election timeout",
        (false, false, 0) => "an election is under way",
        (false, false, _) if term > term0 => "another host won the election",
        (false, false, _) => "the leader of this term made itself known",
    }
}

/// Starts one request on what performs it: S3 and DynamoDB on tasks, the
/// disk WAL, the embedded offsets store and the plugins on blocking threads.
/// Its completion comes back on `tx`.
fn start(id: IoId, op: IoOp, b: &Arc<Backends>, tx: &mpsc::UnboundedSender<Completion>, totals: &Arc<RunTotals>) {
    debug!(io = id.0, op = op_name(&op), "start");
    let b = Arc::clone(b);
    let totals = Arc::clone(totals);
    let done = Done { id, tx: tx.clone() };
    match op {
        IoOp::Wal(WalOp::InstallSnapshot(install)) => match (&b.wal, &b.peers) {
            (WalBackend::Disk(wal), Some(peers)) => {
                let (wal, peers) = (Arc::clone(wal), Arc::clone(peers));
                done.task(async move { install_snapshot(wal, peers, install).await })
            }
            _ => unreachable!("only clustered engines install snapshots"),
        },
        IoOp::Wal(op) => match &b.wal {
            WalBackend::Disk(wal) => {
                let wal = Arc::clone(wal);
                done.blocking(move || {
                    let (started, appended) = (std::time::Instant::now(), appended_bytes(&op));
                    let result = wal.perform(op);
                    count_append(&b, &totals, started, appended, &result);
                    result
                })
            }
            WalBackend::S3(wal) => {
                let wal = Arc::clone(wal);
                done.task(async move {
                    let (started, appended) = (std::time::Instant::now(), appended_bytes(&op));
                    let result = wal.perform(op).await;
                    count_append(&b, &totals, started, appended, &result);
                    result
                })
            }
        },
        IoOp::Offsets(op) => match &b.offsets {
            OffsetsBackend::Disk(db) => {
                let db = Arc::clone(db);
                done.blocking(move || db.perform(op))
            }
            OffsetsBackend::Dynamo(d) => {
                let d = Arc::clone(d);
                done.task(async move { d.perform_offsets(op).await })
            }
        },
        IoOp::Lease(op) => match b.lease.clone() {
            Some(lease) => done.task(async move { lease.perform_lease(op).await }),
            None => {
                error!("the engine asked for the writer lease, but no lease table is configured");
                done.send(Err(IoError::Failed));
            }
        },
        IoOp::Plugin(op) => done.blocking(move || perform_plugin(op, &b, &totals)),
    }
}

/// A snapshot's install: its segments staged (resuming an interrupted
/// transfer of the same manifest), copied from the leader chunk by chunk,
/// checked and swapped in; the leader hears how it ended.
async fn install_snapshot(
    wal: Arc<DiskWal>,
    peers: Arc<Peers>,
    install: skippr_core::Install,
) -> Result<IoReply, IoError> {
    let from = install.from;
    let index = install.manifest.index;
    let bytes: u64 = install.manifest.segments.iter().map(|s| s.bytes).sum();
    info!(from, index, bytes, segments = install.manifest.segments.len(), "installing a snapshot from the leader");
    let started = std::time::Instant::now();
    let result = async {
        let (w, manifest) = (Arc::clone(&wal), install.manifest.clone());
        let staging = tokio::task::spawn_blocking(move || w.stage(&manifest))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot stage the snapshot under the DATA_DIR: {e}"))?;
        crate::peer::transfer::copy(&peers, from, &staging, SNAPSHOT_PATIENCE).await?;
        let hard_state = install.hard_state;
        tokio::task::spawn_blocking(move || wal.install(staging, &hard_state))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("the snapshot was not installed: {e}"))
    }
    .await;
    peers.transfer_ended(from, result.is_ok());
    match result {
        Ok(()) => {
            info!(from, index, seconds = started.elapsed().as_secs_f64(), "snapshot installed");
            Ok(IoReply::Done)
        }
        Err(e) => {
            warn!(from, index, error = %e, "a snapshot's install failed; the old WAL is kept and raft sends another");
            Err(IoError::Failed)
        }
    }
}

/// Where a request's completion goes.
struct Done {
    id: IoId,
    tx: mpsc::UnboundedSender<Completion>,
}

impl Done {
    fn send(self, result: Result<IoReply, IoError>) {
        let _ = self.tx.send((self.id, result));
    }

    fn task(self, work: impl std::future::Future<Output = Result<IoReply, IoError>> + Send + 'static) {
        tokio::spawn(async move { self.send(work.await) });
    }

    fn blocking(self, work: impl FnOnce() -> Result<IoReply, IoError> + Send + 'static) {
        tokio::task::spawn_blocking(move || {
            // A panic in a plugin or a store must not leave the engine
            // waiting forever for this completion: it becomes a failed request.
            let id = self.id;
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|_| {
                tracing::error!(io = id.0, "an I/O request panicked; reporting it as failed");
                Err(IoError::Failed)
            });
            self.send(result);
        });
    }
}

/// The bytes of the commit groups a request writes (clustered mode: every
/// host writes each group it replicates, its own and its leader's).
fn appended_bytes(op: &WalOp) -> Option<usize> {
    match op {
        WalOp::Append { bytes, .. } => Some(bytes.len()),
        WalOp::Replicate(r) if !r.groups.is_empty() => Some(r.groups.iter().map(|g| g.bytes.len()).sum()),
        _ => None,
    }
}

/// An append that succeeded is a commit: timed and counted.
fn count_append(
    b: &Backends,
    totals: &RunTotals,
    started: std::time::Instant,
    appended: Option<usize>,
    result: &Result<IoReply, IoError>,
) {
    let (Ok(_), Some(bytes)) = (result, appended) else { return };
    b.metrics.commit_seconds.observe(started.elapsed().as_secs_f64());
    b.metrics.commits.inc();
    b.metrics.wal_bytes_written.inc_by(bytes as u64);
    totals.commits.fetch_add(1, Ordering::Relaxed);
    totals.wal_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Requests to sources, sinks and the schema plugin.
fn perform_plugin(op: PluginOp, b: &Backends, totals: &RunTotals) -> Result<IoReply, IoError> {
    match op {
        PluginOp::SourceOpen { source, resume, skips } => {
            let mut s = b.sources[source.0 as usize].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            s.pass_over(&skips);
            b.skips.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(source.0, skips);
            s.open(&resume).map(|_| IoReply::Done).map_err(|e| plugin_failed("source open", e))
        }
        PluginOp::SourceRead { source, records_max } => {
            let mut s = b.sources[source.0 as usize].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let (batches, exhausted) = match s.read(records_max) {
                Ok(read) => read,
                Err(e) => match s.refused() {
                    Some(why) => return Ok(IoReply::SourceRefused { why }),
                    None => return Err(plugin_failed("source read", e)),
                },
            };
            let mut streams = Vec::with_capacity(batches.len());
            for batch in &batches {
                let Some(id) = b.streams.id(&batch.stream) else {
                    let why = format!(
                        "partition {} sent records of stream {:?}, which the source did not declare (it declared \
                         {}): a bug of the source, or a stream added without restarting it",
                        batch.partition,
                        batch.stream,
                        b.streams.names().join(", ")
                    );
                    return Ok(IoReply::SourceRefused { why });
                };
                streams.push(id);
            }
            let skips = b.skips.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(&source.0).cloned();
            let faults: Vec<Vec<IntakeFault>> = batches
                .iter()
                .map(|batch| intake_faults(&**s, batch, b.record_bytes_max, skips.as_deref().unwrap_or(&[])))
                .collect();
            // A read the engine refuses is not counted as read (by the
            // engine's own rule: records it quarantines are taken in).
            let letters = b.dead_letters.is_some();
            let counted = faults.iter().flatten().all(|f| skippr_core::rules::quarantines(&f.fault, letters));
            let read_at = std::time::Instant::now();
            let batches: Vec<SourceBatchIn> = batches
                .into_iter()
                .zip(streams)
                .zip(faults)
                .map(|((batch, stream), faults)| {
                    let skipped = |r: &skippr_core::format::Record| {
                        skips
                            .iter()
                            .flatten()
                            .any(|&(p, at, next)| p == batch.partition && at <= r.position && r.position < next)
                    };
                    let given_up = batch.records.iter().filter(|r| skipped(r)).count() as u64;
                    let records = batch.records.len() as u64 - given_up;
                    if counted {
                        totals.records.fetch_add(records, Ordering::Relaxed);
                        if !batch.records.is_empty() {
                            totals.acks.read(source, batch.partition, batch.end, records, read_at);
                        }
                        b.metrics.records.inc_by(records);
                    }
                    SourceBatchIn {
                        partition: batch.partition,
                        stream,
                        records: batch.records,
                        end: batch.end,
                        checkpoint: batch.checkpoint,
                        schema: batch.schema.map(Arc::from),
                        faults,
                        window: batch.window,
                        keys: batch.keys,
                    }
                })
                .collect();
            Ok(IoReply::Batches { batches, exhausted })
        }
        PluginOp::SourceAck { source, acks } => {
            let mut s = b.sources[source.0 as usize].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let acked_at = std::time::Instant::now();
            for &(partition, position) in &acks {
                for wait in totals.acks.acked(source, partition, position, acked_at) {
                    b.metrics.ack_seconds.observe(wait.as_secs_f64());
                }
            }
            s.ack(&acks).map(|_| IoReply::Done).map_err(|e| plugin_failed("source ack", e))
        }
        PluginOp::SchemaDecide { stream, fingerprint, schema } => {
            let Some(plugin) = &b.schema else {
                return Ok(IoReply::Schema { accept: true, reason: String::new() });
            };
            let name = b.streams.name(stream);
            let verdict =
                plugin.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).decide(name, fingerprint, &schema);
            match verdict.map_err(|e| plugin_failed("schema decision", e))? {
                None => Ok(IoReply::Schema { accept: true, reason: String::new() }),
                Some(reason) => Ok(IoReply::Schema { accept: false, reason }),
            }
        }
        PluginOp::SinkProgress { sink } => {
            let mut sink = b.sinks[sink.0 as usize].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let applied =
                sink.progress(b.streams.names()).map_err(|e| plugin_failed("asking a sink for its progress", e))?;
            let by_id = applied
                .into_iter()
                .filter_map(|(name, seq)| Some((b.streams.id(&name)?, skippr_core::CompactionSeq(seq))))
                .collect();
            Ok(IoReply::SinkProgress(by_id))
        }
        PluginOp::SinkApply(a) => {
            let mut sink = b.sinks[a.sink.0 as usize].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let stream = b.streams.name(a.stream);
            let outcome = sink.apply(stream, a.seq.0, a.id, &a.records).map_err(|e| {
                b.metrics.compactions.get_or_create(&vec![("outcome".into(), "error".into())]).inc();
                plugin_failed("sink apply", e)
            })?;
            let label = match outcome {
                SinkOutcome::Applied => "applied",
                SinkOutcome::AlreadyApplied => "already_applied",
                SinkOutcome::Retryable => "retryable",
                SinkOutcome::Fatal | SinkOutcome::FatalUnnamed => "fatal",
                SinkOutcome::Refused(_) => "refused",
            };
            b.metrics.compactions.get_or_create(&vec![("outcome".into(), label.into())]).inc();
            totals.compactions.fetch_add(1, Ordering::Relaxed);
            Ok(IoReply::Sink { outcome, rows: a.records.len() as u64 })
        }
        PluginOp::DeadLetters(a) => {
            // The engine sends dead letters only where a destination is
            // configured.
            let Some(letters) = &b.dead_letters else { return Err(IoError::Failed) };
            let mut letters = letters.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let stream = b.streams.name(a.stream);
            let outcome =
                letters.apply(stream, a.seq.0, a.id, &a.records).map_err(|e| plugin_failed("dead letters", e))?;
            Ok(IoReply::Sink { outcome, rows: a.records.len() as u64 })
        }
    }
}

/// Every record is checked where it enters, before the engine sees its
/// batch: each that breaks a rule of `skippr_core::admit` is named to the
/// engine with the rule and an operator's message, which says what is
/// wrong, where it is and what to do, down to the command that gives up
/// exactly that record (the engine stops with it, or, with dead letters
/// on, quarantines the record). Input an operator skipped is not checked:
/// the engine drops it.
fn intake_faults(
    source: &dyn crate::plugin::Source,
    batch: &Batch,
    bytes_max: u64,
    skips: &[Skip],
) -> Vec<IntakeFault> {
    let mut faults = Vec::new();
    for (i, record) in batch.records.iter().enumerate() {
        let skipped = |&(p, at, next): &Skip| p == batch.partition && at <= record.position && record.position < next;
        // A window's positions name no record for good (a tap's sent again
        // are counted anew): skips apply to no windowed batch.
        let windowed = batch.window != skippr_core::Window::None;
        if !windowed && skips.iter().any(skipped) {
            continue;
        }
        if let Err(fault) = skippr_core::rules::check_record(&record.bytes, bytes_max) {
            let place = source.describe(batch.partition, record.position);
            let next = batch.records.get(i + 1).map_or(batch.end, |r| r.position);
            let give_up = match windowed {
                true => "; a tap's records cannot be given up one by one: keep it out of the tap's output".to_string(),
                false => format!(
                    "; or give up exactly this record: start again with the same settings and `{}` (recorded in \
                     the WAL)",
                    skip_input_arg(&batch.stream, batch.partition, record.position, next)
                ),
            };
            let why = format!(
                "the source sent a record of stream {:?} that is refused ({place}): {fault}. Nothing from it was \
                 committed. Fix the input or the source (or, for a record that is only too large, raise \
                 --record-bytes-max, now {bytes_max}) and start again{give_up}{}",
                crate::plugin::process::clip(&batch.stream),
                match skippr_core::rules::quarantines(&fault, true) {
                    true => "; or let such records go to the dead letters (`--dead-letter dir|s3|postgres`)",
                    false => "",
                }
            );
            faults.push(IntakeFault { position: record.position, fault, why });
        }
    }
    faults
}

/// The `run` option that gives up the input of `partition` of `stream`
/// from `at` to `next`, as an operator types it.
pub fn skip_input_arg(stream: &str, partition: u32, at: Position, next: Position) -> String {
    format!("--skip-input {}:{partition}:{}..{}", crate::plugin::process::clip(stream), at.0, next.0)
}

fn plugin_failed(what: &str, e: crate::plugin::PluginError) -> IoError {
    warn!(error = %e, "{what} failed; retrying");
    IoError::Failed
}

/// What became of the last run's stop record, for the recovery line (and
/// why it was set aside, logged first).
fn stop_record_use(used: StopRecordUse) -> &'static str {
    match used {
        StopRecordUse::Absent => "none",
        StopRecordUse::Used => "used",
        StopRecordUse::Stale(why) => {
            info!(why, "the last run's stop record does not match the WAL; the WAL was scanned");
            "set aside"
        }
    }
}

fn op_name(op: &IoOp) -> &'static str {
    match op {
        IoOp::Wal(WalOp::Sync) => "wal-sync",
        IoOp::Wal(WalOp::List) => "wal-list",
        IoOp::Wal(WalOp::ReadAt { .. }) => "wal-read",
        IoOp::Wal(WalOp::ReadGroups { .. }) => "wal-read-groups",
        IoOp::Wal(WalOp::ReadStopRecord) => "wal-read-stop-record",
        IoOp::Wal(WalOp::WriteStopRecord(_)) => "wal-write-stop-record",
        IoOp::Wal(WalOp::Create { .. }) => "wal-create",
        IoOp::Wal(WalOp::Append { .. }) => "wal-append",
        IoOp::Wal(WalOp::Delete { .. }) => "wal-delete",
        IoOp::Wal(WalOp::Replicate(_)) => "wal-replicate",
        IoOp::Wal(WalOp::ReadHardState) => "wal-read-hard-state",
        IoOp::Wal(WalOp::InstallSnapshot(_)) => "wal-install-snapshot",
        IoOp::Offsets(OffsetsOp::Read) => "offsets-read",
        IoOp::Offsets(OffsetsOp::Write { .. }) => "offsets-write",
        IoOp::Plugin(PluginOp::SourceOpen { .. }) => "source-open",
        IoOp::Plugin(PluginOp::SourceRead { .. }) => "source-read",
        IoOp::Plugin(PluginOp::SourceAck { .. }) => "source-ack",
        IoOp::Plugin(PluginOp::SinkApply(_)) => "sink-apply",
        IoOp::Plugin(PluginOp::DeadLetters(_)) => "dead-letters",
        IoOp::Plugin(PluginOp::SinkProgress { .. }) => "sink-progress",
        IoOp::Plugin(PluginOp::SchemaDecide { .. }) => "schema-decide",
        IoOp::Lease(LeaseOp::Read) => "lease-read",
        IoOp::Lease(LeaseOp::Write { .. }) => "lease-write",
    }
}
