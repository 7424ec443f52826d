//! The one event loop. It waits on the engine's next deadline, on I/O
//! completions and on the shutdown signal; feeds one input; drains every
//! output, starting each request on a blocking thread and sending its
//! completion back by `IoId`. It makes no decisions: every policy is in core.

use crate::clock::Clock;
use crate::disk_wal::{to_io_error, DiskWal};
use crate::dynamo::Dynamo;
use crate::metrics::Metrics;
use crate::offsets_db::OffsetsDb;
use crate::plugins::{SchemaPlugin, Sink, Source};
use crate::s3_wal::S3Wal;
use skippr_core::io::{Input, IoOp, IoReply, Output, SourceBatchIn, StopReason};
use skippr_core::{Host, IoError, IoId, SinkOutcome, StreamId};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

pub type SharedSource = Arc<Mutex<Box<dyn Source>>>;
pub type SharedSink = Arc<Mutex<Box<dyn Sink>>>;
pub type SharedSchema = Arc<Mutex<Box<dyn SchemaPlugin>>>;

/// Where the WAL lives.
pub enum WalBackend {
    Disk(Arc<DiskWal>),
    S3(Arc<S3Wal>),
}

/// Where offsets are materialized.
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
    /// Stream names by `StreamId`.
    pub streams: Arc<Vec<String>>,
    /// Sink names by `SinkId`.
    pub sink_names: Vec<String>,
    /// The schema plugin, if one is configured.
    pub schema: Option<SharedSchema>,
    pub metrics: Arc<Metrics>,
    /// Where the WAL is, and which endpoints serve it, for the stall report.
    pub place: String,
    pub endpoints: String,
}

/// Counts for the run's summary line.
#[derive(Default)]
pub struct RunTotals {
    pub records: AtomicU64,
    pub commits: AtomicU64,
    pub compactions: AtomicU64,
}

type Completion = (IoId, Result<IoReply, IoError>);

/// Runs the engine until it stops. `shutdown` delivers SIGTERM/SIGINT.
pub async fn drive(
    mut host: Host,
    backends: Backends,
    clock: Clock,
    mut shutdown: mpsc::Receiver<()>,
    totals: Arc<RunTotals>,
) -> StopReason {
    let (tx, mut rx) = mpsc::unbounded_channel::<Completion>();
    let backends = Arc::new(backends);
    let mut shutdown_open = true;
    loop {
        while let Some(output) = host.poll_output() {
            match output {
                Output::Io { id, op } => start(id, op, &backends, &tx, &totals),
                Output::Recovered(s) => {
                    backends.metrics.recovery_seconds.set(clock.now().as_micros() as f64 / 1e6);
                    info!(
                        segments = s.segments,
                        next_lsn = s.next_lsn.0,
                        partitions = s.partitions,
                        open_compactions = s.open_compactions,
                        "recovered"
                    )
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
                Output::Unstalled => {
                    backends.metrics.stalled.set(0);
                    info!(wal = %backends.place, "the WAL makes progress again");
                }
                Output::Stopped(reason) => return reason,
                Output::LeaseWait { holder, generation } => info!(
                    holder = format!("{holder:016x}"),
                    generation,
                    "another writer holds the WAL's lease; waiting for it to release it or stop renewing it"
                ),
            }
        }
        for (sink, stream, lag) in host.compaction_lag() {
            let labels = vec![
                ("sink".to_string(), backends.sink_names[sink.0 as usize].clone()),
                ("stream".to_string(), backends.streams[stream.0 as usize].clone()),
            ];
            backends.metrics.compaction_lag.get_or_create(&labels).set(lag as i64);
        }
        let deadline = host.poll_timeout();
        let sleep = deadline.map(|(at, _)| tokio::time::Instant::from_std(clock.to_std(at)));
        tokio::select! {
            Some((id, result)) = rx.recv() => host.handle(clock.now(), Input::IoDone { id, result }),
            _ = async { tokio::time::sleep_until(sleep.expect("guarded")).await }, if sleep.is_some() => {
                host.handle(clock.now(), Input::Timeout)
            }
            signal = shutdown.recv(), if shutdown_open => {
                shutdown_open = false;
                if signal.is_some() {
                    info!("shutdown requested: draining");
                    host.handle(clock.now(), Input::Shutdown);
                }
            }
        }
    }
}

/// Starts one request, on a task for the AWS services and on a blocking
/// thread for everything else; its completion comes back on `tx`.
fn start(id: IoId, op: IoOp, b: &Arc<Backends>, tx: &mpsc::UnboundedSender<Completion>, totals: &Arc<RunTotals>) {
    debug!(io = id.0, op = op_name(&op), "start");
    let b = Arc::clone(b);
    let tx = tx.clone();
    let totals = Arc::clone(totals);
    if is_remote(&op, &b) {
        tokio::spawn(async move {
            let result = perform_remote(op, &b, &totals).await;
            let _ = tx.send((id, result));
        });
        return;
    }
    tokio::task::spawn_blocking(move || {
        // A panic in a plugin or a store must not leave the engine waiting
        // forever for this completion: it becomes a failed request.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| perform(op, &b, &totals)))
            .unwrap_or_else(|_| {
                tracing::error!(io = id.0, "an I/O request panicked; reporting it as failed");
                Err(IoError::Failed)
            });
        let _ = tx.send((id, result));
    });
}

fn is_remote(op: &IoOp, b: &Backends) -> bool {
    match op {
        IoOp::WalSync
        | IoOp::WalList
        | IoOp::WalRead { .. }
        | IoOp::WalCreate { .. }
        | IoOp::WalAppend { .. }
        | IoOp::WalDelete { .. } => matches!(b.wal, WalBackend::S3(_)),
        IoOp::OffsetsRead | IoOp::OffsetsWrite { .. } => matches!(b.offsets, OffsetsBackend::Dynamo(_)),
        IoOp::LeaseRead | IoOp::LeaseWrite { .. } => true,
        _ => false,
    }
}

/// Requests to S3 and DynamoDB.
async fn perform_remote(op: IoOp, b: &Backends, totals: &RunTotals) -> Result<IoReply, IoError> {
    let no_lease = || {
        tracing::error!("the engine asked for the writer lease, but no lease table is configured");
        IoError::Failed
    };
    match (op, &b.wal, &b.offsets) {
        (IoOp::WalSync, WalBackend::S3(_), _) => Ok(IoReply::Done),
        (IoOp::WalList, WalBackend::S3(wal), _) => wal.list().await.map(IoReply::Segments),
        (IoOp::WalRead { segment }, WalBackend::S3(wal), _) => wal.read(segment).await.map(IoReply::SegmentBytes),
        (IoOp::WalCreate { segment, header }, WalBackend::S3(wal), _) => {
            wal.put(segment, 0, &header).await.map(|()| IoReply::Done)
        }
        (IoOp::WalAppend { segment, offset, bytes, .. }, WalBackend::S3(wal), _) => {
            let started = std::time::Instant::now();
            wal.put(segment, offset, &bytes).await?;
            committed(b, totals, started, bytes.len());
            Ok(IoReply::Done)
        }
        (IoOp::WalDelete { segment }, WalBackend::S3(wal), _) => wal.delete(segment).await.map(|()| IoReply::Done),
        (IoOp::OffsetsRead, _, OffsetsBackend::Dynamo(d)) => d.read().await.map(IoReply::Offsets),
        (IoOp::OffsetsWrite { entries }, _, OffsetsBackend::Dynamo(d)) => {
            d.write(&entries).await.map(|()| IoReply::Done)
        }
        (IoOp::LeaseRead, _, _) => b.lease.as_ref().ok_or_else(no_lease)?.lease_read().await.map(IoReply::Lease),
        (IoOp::LeaseWrite { expected, row }, _, _) => {
            b.lease.as_ref().ok_or_else(no_lease)?.lease_write(expected, row).await.map(|()| IoReply::Done)
        }
        (op, _, _) => unreachable!("{} is not a remote request here", op_name(&op)),
    }
}

fn committed(b: &Backends, totals: &RunTotals, started: std::time::Instant, bytes: usize) {
    b.metrics.commit_seconds.observe(started.elapsed().as_secs_f64());
    b.metrics.commits.inc();
    b.metrics.wal_bytes_written.inc_by(bytes as u64);
    totals.commits.fetch_add(1, Ordering::Relaxed);
}

fn perform(op: IoOp, b: &Backends, totals: &RunTotals) -> Result<IoReply, IoError> {
    // WAL requests come here only for the disk backend (see `is_remote`).
    let wal = || match &b.wal {
        WalBackend::Disk(wal) => wal,
        WalBackend::S3(_) => unreachable!("requests to S3 are performed on tasks"),
    };
    let io = |what: &str, e: std::io::Error| {
        warn!(error = %e, "{what} failed");
        to_io_error(&e)
    };
    match op {
        IoOp::WalSync => wal().sync_all().map(|_| IoReply::Done).map_err(|e| io("syncing the WAL", e)),
        IoOp::WalList => {
            let (ids, strays) = wal().list().map_err(|e| io("listing the WAL", e))?;
            for path in strays {
                warn!(path = %path.display(), "ignoring a file in the WAL directory that is not a segment");
            }
            Ok(IoReply::Segments(ids))
        }
        IoOp::WalRead { segment } => {
            wal().read(segment).map(IoReply::SegmentBytes).map_err(|e| io("reading a WAL segment", e))
        }
        IoOp::WalCreate { segment, header } => {
            wal().create(segment, &header).map(|_| IoReply::Done).map_err(|e| io("creating a WAL segment", e))
        }
        IoOp::WalAppend { segment, offset, bytes, .. } => {
            let started = std::time::Instant::now();
            wal().append(segment, offset, &bytes).map_err(|e| io("appending to the WAL", e))?;
            committed(b, totals, started, bytes.len());
            Ok(IoReply::Done)
        }
        IoOp::WalDelete { segment } => {
            wal().delete(segment).map(|_| IoReply::Done).map_err(|e| io("deleting a WAL segment", e))
        }
        IoOp::OffsetsRead | IoOp::OffsetsWrite { .. } | IoOp::LeaseRead | IoOp::LeaseWrite { .. }
            if is_remote(&op, b) =>
        {
            unreachable!("remote requests are performed on tasks")
        }
        IoOp::OffsetsRead => disk_offsets(b).read().map(IoReply::Offsets).map_err(|e| {
            warn!(error = %e, "reading offsets failed");
            IoError::Failed
        }),
        IoOp::OffsetsWrite { entries } => disk_offsets(b).write(&entries).map(|_| IoReply::Done).map_err(|e| {
            warn!(error = %e, "writing offsets failed");
            IoError::Failed
        }),
        IoOp::LeaseRead | IoOp::LeaseWrite { .. } => unreachable!("lease requests are remote"),
        IoOp::SourceOpen { source, resume } => {
            let mut s = b.sources[source.0 as usize].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            s.open(&resume).map(|_| IoReply::Done).map_err(|e| plugin_failed("source open", e))
        }
        IoOp::SourceRead { source, records_max } => {
            let mut s = b.sources[source.0 as usize].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let (batches, exhausted) = s.read(records_max).map_err(|e| plugin_failed("source read", e))?;
            let batches: Vec<SourceBatchIn> = batches
                .into_iter()
                .map(|batch| {
                    totals.records.fetch_add(batch.records.len() as u64, Ordering::Relaxed);
                    b.metrics.records.inc_by(batch.records.len() as u64);
                    // An unknown stream name maps to an id the engine
                    // rejects as a protocol error.
                    let stream = b.streams.iter().position(|s| *s == batch.stream).unwrap_or(u16::MAX as usize);
                    SourceBatchIn {
                        partition: batch.partition,
                        stream: StreamId(stream as u16),
                        records: batch.records,
                        end: batch.end,
                        checkpoint: batch.checkpoint,
                        schema: batch.schema.map(Arc::from),
                    }
                })
                .collect();
            Ok(IoReply::Batches { batches, exhausted })
        }
        IoOp::SourceAck { source, acks } => {
            let mut s = b.sources[source.0 as usize].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            s.ack(&acks).map(|_| IoReply::Done).map_err(|e| plugin_failed("source ack", e))
        }
        IoOp::SchemaDecide { stream, fingerprint, schema } => {
            let Some(plugin) = &b.schema else {
                return Ok(IoReply::Schema { accept: true, reason: String::new() });
            };
            let name = &b.streams[stream.0 as usize];
            let verdict =
                plugin.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).decide(name, fingerprint, &schema);
            match verdict.map_err(|e| plugin_failed("schema decision", e))? {
                None => Ok(IoReply::Schema { accept: true, reason: String::new() }),
                Some(reason) => Ok(IoReply::Schema { accept: false, reason }),
            }
        }
        IoOp::SinkProgress { sink } => {
            let mut sink = b.sinks[sink.0 as usize].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let applied = sink.progress(&b.streams).map_err(|e| plugin_failed("asking a sink for its progress", e))?;
            let by_id = applied
                .into_iter()
                .filter_map(|(name, seq)| {
                    let stream = b.streams.iter().position(|s| *s == name)?;
                    Some((skippr_core::StreamId(stream as u16), skippr_core::CompactionSeq(seq)))
                })
                .collect();
            Ok(IoReply::SinkProgress(by_id))
        }
        IoOp::SinkApply(a) => {
            let mut sink = b.sinks[a.sink.0 as usize].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let stream = &b.streams[a.stream.0 as usize];
            let outcome = sink.apply(stream, a.seq.0, a.id, &a.records).map_err(|e| {
                b.metrics.compactions.get_or_create(&vec![("outcome".into(), "error".into())]).inc();
                plugin_failed("sink apply", e)
            })?;
            let label = match outcome {
                SinkOutcome::Applied => "applied",
                SinkOutcome::AlreadyApplied => "already_applied",
                SinkOutcome::Retryable => "retryable",
                SinkOutcome::Fatal => "fatal",
            };
            b.metrics.compactions.get_or_create(&vec![("outcome".into(), label.into())]).inc();
            totals.compactions.fetch_add(1, Ordering::Relaxed);
            Ok(IoReply::Sink { outcome, rows: a.records.len() as u64 })
        }
    }
}

fn disk_offsets(b: &Backends) -> &OffsetsDb {
    match &b.offsets {
        OffsetsBackend::Disk(db) => db,
        OffsetsBackend::Dynamo(_) => unreachable!("DynamoDB requests are performed on tasks"),
    }
}

fn plugin_failed(what: &str, e: crate::plugins::PluginError) -> IoError {
    warn!(error = %e, "{what} failed; retrying");
    IoError::Failed
}

fn op_name(op: &IoOp) -> &'static str {
    match op {
        IoOp::WalSync => "wal-sync",
        IoOp::WalList => "wal-list",
        IoOp::WalRead { .. } => "wal-read",
        IoOp::WalCreate { .. } => "wal-create",
        IoOp::WalAppend { .. } => "wal-append",
        IoOp::WalDelete { .. } => "wal-delete",
        IoOp::OffsetsRead => "offsets-read",
        IoOp::OffsetsWrite { .. } => "offsets-write",
        IoOp::SourceOpen { .. } => "source-open",
        IoOp::SourceRead { .. } => "source-read",
        IoOp::SourceAck { .. } => "source-ack",
        IoOp::SinkApply(_) => "sink-apply",
        IoOp::SinkProgress { .. } => "sink-progress",
        IoOp::SchemaDecide { .. } => "schema-decide",
        IoOp::LeaseRead => "lease-read",
        IoOp::LeaseWrite { .. } => "lease-write",
    }
}

/// Where the WAL is, for messages.
#[derive(Clone, Debug)]
pub enum WalPlace {
    Dir(std::path::PathBuf),
    /// `s3://bucket/prefix/`
    S3(String),
}

impl WalPlace {
    pub fn segment(&self, segment: skippr_core::SegmentId) -> String {
        match self {
            WalPlace::Dir(dir) => dir.join(format!("{:020}.seg", segment.0)).display().to_string(),
            WalPlace::S3(location) => format!("{location}{:020}/", segment.0),
        }
    }

    pub fn root(&self) -> String {
        match self {
            WalPlace::Dir(dir) => dir.display().to_string(),
            WalPlace::S3(location) => location.clone(),
        }
    }
}

/// What an engine stop means to an operator: one line naming the cause and
/// what to do.
/// One sentence on committed WAL that is not there, for the daemon's stop
/// and for `skipprd wal verify`; `name` says where a segment lives.
pub fn missing_message(m: &skippr_core::recovery::Missing, name: impl Fn(skippr_core::SegmentId) -> String) -> String {
    use skippr_core::recovery::Missing;
    match m {
        Missing::Gap { after, before, lsns } => {
            let range = lsns.map(|(a, b)| format!(", which held LSNs {} to {},", a.0, b.0)).unwrap_or_default();
            let what = if before.0 == after.0 + 2 {
                format!("segment {}{range} is missing", name(skippr_core::SegmentId(after.0 + 1)))
            } else {
                format!("the segments between {} and {}{range} are missing", name(*after), name(*before))
            };
            format!("the WAL is not whole: {what}; every segment after it continues from those LSNs")
        }
        Missing::Head { first, first_lsn, sink_name, key, source_name, acked, needed_to, .. } => format!(
            "the WAL is not whole: its oldest segment {} starts at LSN {}, but the segments before it were still \
             needed: sink '{sink_name}' has acknowledged source '{source_name}' partition {} only below position {}, \
             and the missing segments held its records up to position {}",
            name(*first),
            first_lsn.0,
            key.partition,
            acked.0,
            needed_to.0
        ),
    }
}

pub fn explain(reason: &StopReason, wal: &WalPlace) -> String {
    match reason {
        StopReason::Clean => "stopped cleanly".into(),
        StopReason::DrainTimedOut => {
            "the shutdown drain timed out; the next start recovers from the WAL (raise --drain-timeout if sinks are slow)"
                .into()
        }
        StopReason::Corrupt(c) => format!(
            "committed WAL data is corrupt: {} at byte {}: {}. Nothing past it was delivered. Keep a copy of {} for \
             diagnosis; `skipprd wal verify` shows the damage. Restoring the segment from a replica or backup is \
             the only way to keep its records",
            wal.segment(c.segment),
            c.offset,
            c.what,
            wal.root()
        ),
        StopReason::WalIncomplete(m) => format!(
            "{}. Nothing was delivered from this WAL. Put the missing segments back (from the backup or copy they \
             came from) and start again; starting over from an empty DATA_DIR (or WAL prefix) re-reads the sources \
             into a fresh sink destination",
            missing_message(m, |id| wal.segment(id))
        ),
        StopReason::OffsetsAheadOfWal { key, store, wal } => format!(
            "the offsets store holds position {} for source {} partition {}, but the WAL only reaches {}: committed \
             WAL data is missing (a wiped or wrong data directory?). If that is deliberate, run `skipprd offsets reset` \
             and sources will resume from what the WAL holds",
            store.0, key.source.0, key.partition, wal.0
        ),
        StopReason::SinkAheadOfWal { sink, stream, applied, wal_next } => format!(
            "sink {} has applied batch {} of stream {}, but the WAL has planned batches only below {}: the WAL is \
             older than what the sink holds (a data directory restored from an older backup, or a new WAL beside \
             a destination an older one wrote). Nothing was delivered. Restore the newer WAL, or point the sink \
             at a fresh destination to start over",
            sink.0, applied.0, stream.0, wal_next.0
        ),
        StopReason::OffsetsMalformed { key, len } => format!(
            "the offsets store holds a {len}-byte value for source {} partition {} (expected 24): it is damaged or \
             not ours; `skipprd offsets reset` rebuilds it from the WAL",
            key.source.0, key.partition
        ),
        StopReason::WalReadFailed { segment } => format!(
            "WAL segment {} could not be read, even after retries (see the warnings above): recovery cannot \
             trust or skip it. Check the disk (or bucket) and its permissions, then start again",
            wal.segment(*segment)
        ),
        StopReason::WalWriteFailed { segment, error } => format!(
            "writing WAL segment {} failed ({error:?}); nothing unacknowledged was reported durable. Check the disk \
             and start again: recovery decides what the WAL holds",
            segment.0
        ),
        StopReason::Fenced { segment, offset } => format!(
            "another writer committed at {} byte {offset}, where this one was about to: a newer writer took \
             over this WAL (or raced this one). Nothing of this writer's that was not committed was acknowledged; \
             run only one daemon per WAL, and start this one again only if the other is gone",
            wal.segment(*segment)
        ),
        StopReason::LeaseLost { holder: 0, generation } => format!(
            "the WAL's writer lease passed to another writer while this one ran (it was paused or cut off for \
             longer than SKIPPR_LEASE_SECONDS), and that writer has since released it: no daemon holds the lease \
             of {} now (generation {generation}). Stopped without acknowledging anything more; the next start \
             takes the lease again",
            wal.root()
        ),
        StopReason::LeaseLost { holder, generation } => format!(
            "the WAL's writer lease was taken over (holder {holder:016x}, generation {generation}) while this \
             writer ran: another daemon is writing {}. Stopped without acknowledging anything more",
            wal.root()
        ),
        StopReason::SinkFatal { sink, stream, id } => format!(
            "sink {} refused compaction {id} of stream {} as fatal; that stream is stopped. Fix the sink or its \
             destination, then start again: the batch is replayed with the same id",
            sink.0, stream.0
        ),
        StopReason::SourceProtocol { source, partition, what } => {
            format!("source {} partition {partition} broke the protocol: {what}", source.0)
        }
        StopReason::NamesChanged { kind, index, wal, config } => format!(
            "the WAL knows {kind} #{index} as '{wal}', but the configuration calls it '{config}': {kind}s are \
             identified by their place in the configuration, so keep existing ones in order and add new ones at \
             the end (or start a new DATA_DIR)"
        ),
        StopReason::SchemaRejected { stream, fingerprint, reason } => format!(
            "the schema plugin refused schema {fingerprint:016x} of stream {}: {reason}. Nothing under it was \
             committed; fix the source or the schema plugin and start again",
            stream.0
        ),
        StopReason::Stalled { what, for_ } => format!(
            "the {what} made no progress for {:.0} s (every request failed; the last warning above names the \
             cause), and --once gives up after SKIPPR_STALL_EXIT_SECONDS. Nothing committed is lost: fix the \
             endpoint or disk, then start again and recovery carries on from the WAL ({})",
            for_.as_micros() as f64 / 1e6,
            wal.root()
        ),
        StopReason::SegmentTooSmall { needed } => {
            format!("WAL_BYTES_PER_FILE is too small for the engine's snapshot: use at least {needed} bytes")
        }
    }
}
