//! `skipprd run`: the daemon. Resolves the configuration, takes the lock on
//! `DATA_DIR` when the WAL or the offsets live there, builds the WAL (disk or
//! S3), the offsets store (disk or DynamoDB), the writer lease (S3 mode), the
//! source and the sink, and drives the engine until it stops; then maps the
//! stop to an exit code and prints one summary line.

use crate::config::{
    resolve, BatchSkip, DeadLetterConfig, DeadLetterTo, InputSkip, OffsetsConfig, RunArgs, RunConfig, SinkConfig,
    SourceConfig, WalConfig,
};
use crate::exit;
use crate::explain::{explain, WalPlace};
use skippr_core::ledger::Scope;
use skippr_core::{BatchSkipRequest, CompactionSeq, SinkId, SkipRequest};
use skippr_core::{Duration, Host, HostConfig, LeaseConfig, Limits, Mutations, StopReason};
use skippr_core::{PartitionKey, Position, SourceId, StreamId};
use skippr_io::driver::{SharedSchema, SharedSink, SharedSource};
use skippr_io::dynamo::Dynamo;
use skippr_io::metrics::Metrics;
use skippr_io::plugin::postgres_sink::{PostgresSink, Refused};
use skippr_io::plugin::replay::{LetterReplay, Paused};
use skippr_io::plugin::s3_sink::{S3Sink, S3SinkTarget};
use skippr_io::plugin::{
    singer::SingerSettings, DirSink, ExternalSchema, ExternalSink, ExternalSource, FileSource, Generator, SchemaPlugin,
    SingerSource, Sink, Source, StdoutSink,
};
use skippr_io::s3_wal::S3Wal;
use skippr_io::{drive, Backends, Clock, DiskWal, OffsetsDb, RunTotals};
use skippr_io::{OffsetsBackend, WalBackend};
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tracing::{error, info, warn};

/// What an engine run reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The pipeline's source (`skipprd run`).
    Daemon,
    /// The dead letters the destination holds at start, the pipeline's own
    /// source paused; stops once they are delivered (`skipprd dead-letters
    /// replay`).
    Replay,
}

impl Mode {
    fn command(self) -> &'static str {
        match self {
            Mode::Daemon => "skipprd run",
            Mode::Replay => "skipprd dead-letters replay",
        }
    }
}

/// The engine's sources, by `SourceId`: the pipeline's own, then the
/// replay of dead letters (in every run, so that the WAL's names stay the
/// same whichever command ran last).
fn source_names() -> Vec<String> {
    vec!["source".into(), skippr_io::plugin::replay::REPLAY_SOURCE.into()]
}

pub fn main(args: RunArgs, mode: Mode) -> i32 {
    let cfg = match resolve(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: {e}", mode.command());
            return exit::CONFIG;
        }
    };
    if mode == Mode::Replay {
        if let Err(e) = replay_allowed(&cfg) {
            eprintln!("{}: {e}", mode.command());
            return exit::CONFIG;
        }
    }
    let node = match &cfg.wal {
        WalConfig::Clustered(c) => Some(c.node),
        _ => None,
    };
    crate::logging::init(cfg.json_logs, node);
    // A clustered host without its identity takes no part: refused before
    // the lock or the WAL's directory are made, so it leaves nothing behind.
    if node.is_some() {
        if let Err((code, e)) = crate::cluster::check_identity(&cfg.data_dir) {
            error!("{e}");
            eprintln!("{}: {e}", mode.command());
            return code;
        }
    }
    // One writer per WAL: on disk the directory lock says so; in S3 mode the
    // lease does.
    let local = !matches!(cfg.wal, WalConfig::S3 { .. }) || cfg.offsets == OffsetsConfig::Disk;
    let _lock = match local.then(|| lock_data_dir(&cfg.data_dir)).transpose() {
        Ok(lock) => lock,
        Err(e) => {
            error!("{e}");
            eprintln!("{}: {e}", mode.command());
            return exit::DATA_DIR;
        }
    };
    crate::chaos::arm_from_env();
    match skippr_io::planted::arm_from_env() {
        Ok(faults) => {
            for f in faults {
                warn!(
                    fault = f.name(),
                    "a planted driver fault is armed: this run breaks a durability rule on purpose"
                );
            }
        }
        Err(e) => {
            eprintln!("{}: {e}", mode.command());
            return exit::USAGE;
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    runtime.block_on(run(cfg, mode))
}

/// A replay needs somewhere to read dead letters from, and one engine that
/// surely leads.
fn replay_allowed(cfg: &RunConfig) -> Result<(), String> {
    if cfg.dead_letter.is_none() {
        return Err("--dead-letter is off in these settings, so there are no dead letters to replay: give the \
                    settings the daemon runs with (--dead-letter dir, postgres or s3, and where)"
            .into());
    }
    if matches!(cfg.wal, WalConfig::Clustered(_)) {
        return Err("a replay of dead letters runs on a disk or S3 WAL; a clustered WAL cannot replay them yet".into());
    }
    if cfg.once {
        return Err("--once is what a replay does anyway: it stops once the dead letters are delivered; leave it \
                    out"
        .into());
    }
    Ok(())
}

/// Creates DATA_DIR (and its parents) readable by its owner only (0700):
/// it holds the WAL and the offsets store, whose checkpoints may carry a
/// tap's state. One that exists with access for others is kept as it is,
/// with a warning.
fn create_data_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    skippr_io::disk_wal::create_dir_durably(dir, 0o700)
        .map_err(|e| format!("cannot create DATA_DIR {}: {e}", dir.display()))?;
    let mode = std::fs::metadata(dir).map(|m| m.permissions().mode() & 0o777).unwrap_or(0o700);
    if mode & 0o077 != 0 {
        tracing::warn!(
            "DATA_DIR {} has mode {mode:04o}: other users may read the WAL and the offsets store; chmod 700 it",
            dir.display()
        );
    }
    Ok(())
}

/// Takes the exclusive lock on `DATA_DIR/LOCK`, creating the directory.
fn lock_data_dir(dir: &Path) -> Result<File, String> {
    create_data_dir(dir)?;
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("cannot open {} (is DATA_DIR writable?): {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "another skipprd is running on DATA_DIR {} (it holds {}); stop it first, or give this one another DATA_DIR",
            dir.display(),
            path.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("cannot lock {}: {e}", path.display())),
    }
}

/// The source, sink and schema plugin of one engine run.
struct Plugins {
    source: Box<dyn Source>,
    sink: Box<dyn Sink>,
    schema: Option<SharedSchema>,
    dead_letters: Option<SharedSink>,
}

fn plugins(cfg: &RunConfig, wal_identity: &str, s3: &S3Targets) -> Result<Plugins, (i32, String)> {
    let timeout = std::time::Duration::from_secs_f64(cfg.plugin_timeout_seconds);
    // Each stream's key, where the source declares one (a Singer catalog's
    // `key_properties`): what an upserting sink dedupes by.
    let mut keys: Vec<(String, Vec<String>)> = Vec::new();
    let source: Box<dyn Source> = match &cfg.source {
        SourceConfig::Generator(g) => Box::new(Generator::from_config(g)),
        SourceConfig::File(f) => {
            if !f.dir.is_dir() {
                return Err((exit::CONFIG, format!("the file source's directory {} does not exist", f.dir.display())));
            }
            Box::new(FileSource::new(&f.dir, &f.stream, f.follow).with_record_bytes_max(cfg.record_bytes_max))
        }
        SourceConfig::Command { command } => Box::new(
            ExternalSource::start("source", command, timeout, cfg.record_bytes_max)
                .map_err(|e| (exit::PLUGIN, e.to_string()))?,
        ),
        SourceConfig::Singer(singer) => {
            let settings = SingerSettings {
                command: singer.command.clone(),
                catalog: singer.catalog.clone(),
                properties: singer.properties.clone(),
                // --once: one sync, then the daemon drains and exits.
                interval: if cfg.once { None } else { singer.interval.map(std::time::Duration::from_secs_f64) },
                timeout,
                record_bytes_max: cfg.record_bytes_max,
            };
            let source = SingerSource::start(settings).map_err(|e| (exit::PLUGIN, e.to_string()))?;
            keys = source.singer_streams().iter().map(|s| (s.name.clone(), s.key_properties.clone())).collect();
            Box::new(source)
        }
    };
    let sink: Box<dyn Sink> = match &cfg.sink {
        SinkConfig::Dir(d) => {
            let scope = Scope::new(&cfg.pipeline, wal_identity);
            Box::new(DirSink::open(&d.dir, &scope).map_err(|e| (exit::DATA_DIR, e.to_string()))?.with_mode(d.mode))
        }
        SinkConfig::Stdout => Box::new(StdoutSink),
        SinkConfig::Command { command } => {
            Box::new(ExternalSink::start("sink", command, timeout).map_err(|e| (exit::PLUGIN, e.to_string()))?)
        }
        SinkConfig::Postgres(p) => {
            let streams = source.streams();
            let settings = p.settings(&keys).map_err(|e| (exit::CONFIG, e))?;
            // The client blocks on a runtime of its own: not on this one's thread.
            let opened = std::thread::scope(|s| {
                s.spawn(|| PostgresSink::open(settings, &cfg.pipeline, wal_identity, &streams)).join()
            });
            let sink =
                opened.expect("opening the postgres sink panicked").map_err(|Refused(why)| (exit::CONFIG, why))?;
            Box::new(sink)
        }
        SinkConfig::S3(_) => Box::new(S3Sink::new(
            s3.sink.clone().expect("connected before the engine starts"),
            &Scope::new(&cfg.pipeline, wal_identity),
            tokio::runtime::Handle::current(),
        )),
    };
    let schema: Option<SharedSchema> = match &cfg.schema_command {
        None => None,
        Some(command) => {
            let s = ExternalSchema::start("schema", command, timeout).map_err(|e| (exit::PLUGIN, e.to_string()))?;
            Some(Arc::new(Mutex::new(Box::new(s) as Box<dyn SchemaPlugin>)))
        }
    };
    let dead_letters = match &cfg.dead_letter {
        None => None,
        Some(DeadLetterConfig { to: DeadLetterTo::Dir(dir), .. }) => {
            let scope = Scope::new(&cfg.pipeline, wal_identity);
            let letters = DirSink::open(dir, &scope).map_err(|e| (exit::DATA_DIR, e.to_string()))?;
            Some(Arc::new(Mutex::new(Box::new(letters) as Box<dyn Sink>)) as SharedSink)
        }
        Some(DeadLetterConfig { to: DeadLetterTo::S3(_), .. }) => {
            let letters = S3Sink::new(
                s3.letters.clone().expect("connected before the engine starts"),
                &Scope::new(&cfg.pipeline, wal_identity),
                tokio::runtime::Handle::current(),
            );
            Some(Arc::new(Mutex::new(Box::new(letters) as Box<dyn Sink>)) as SharedSink)
        }
        Some(DeadLetterConfig { to: DeadLetterTo::Postgres(p), .. }) => {
            let streams = source.streams();
            let settings = p.settings(&[]).map_err(|e| (exit::CONFIG, e))?;
            let opened = std::thread::scope(|s| {
                s.spawn(|| PostgresSink::open(settings, &cfg.pipeline, wal_identity, &streams)).join()
            });
            let letters = opened
                .expect("opening the postgres dead-letter destination panicked")
                .map_err(|Refused(why)| (exit::CONFIG, format!("the dead-letter destination: {why}")))?;
            Some(Arc::new(Mutex::new(Box::new(letters) as Box<dyn Sink>)) as SharedSink)
        }
    };
    Ok(Plugins { source, sink, schema, dead_letters })
}

async fn run(cfg: RunConfig, mode: Mode) -> i32 {
    let started = std::time::Instant::now();
    let fail = |(code, e): (i32, String)| {
        error!("{e}");
        eprintln!("{}: {e}", mode.command());
        code
    };
    let stores = match open_stores(&cfg).await {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let (wal, offsets, lease, place, endpoints, s3) = stores;
    let endpoints = endpoints.unwrap_or_else(|| "none (local disk)".into());
    let metrics_dir = match &place {
        WalPlace::Dir(dir) => Some(dir.clone()),
        WalPlace::S3(_) => None,
    };
    let metrics = Arc::new(Metrics::new(metrics_dir));
    if let Some(addr) = cfg.metrics_addr {
        if let Err(e) = skippr_io::metrics::serve(Arc::clone(&metrics), addr) {
            return fail((exit::CONFIG, format!("cannot serve metrics on {addr}: {e}")));
        }
    }
    let mut cluster = match (&cfg.wal, &wal) {
        (WalConfig::Clustered(c), WalBackend::Disk(disk)) => match crate::cluster::start_peers(&cfg, c, disk).await {
            Ok(started) => Some(started),
            Err(e) => return fail(e),
        },
        _ => None,
    };
    let mut shutdown = crate::signals::listen();
    let totals = Arc::new(RunTotals::default());
    info!(wal = place.root(), endpoints = %endpoints, once = cfg.once, allocator = crate::alloc::name(), "starting");
    let wal_identity = match wal_identity(&cfg) {
        Ok(w) => w,
        Err(e) => return fail(e),
    };
    // The dead letters there are now: what this replay sends, and all it
    // sends (those its own records add wait for the next one).
    let held = match (mode, &cfg.dead_letter) {
        (Mode::Replay, Some(DeadLetterConfig { to, .. })) => {
            match crate::letters::read_held(&cfg, to, &wal_identity).await {
                Ok(held) => held,
                Err(e) => return fail((exit::REMOTE, e)),
            }
        }
        _ => Vec::new(),
    };
    let clock = Clock::start();
    let mut stream_names: Vec<String> = Vec::new();
    let reason = loop {
        let Plugins { source, sink, schema, dead_letters } = match plugins(&cfg, &wal_identity, &s3) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        let streams = source.streams();
        let (source, replay): (Box<dyn Source>, Box<dyn Source>) = match mode {
            Mode::Daemon => (source, Box::new(Paused::new(Vec::new()))),
            Mode::Replay => {
                // Only the streams are asked of the pipeline's source; it is
                // dropped before anything is read (a process it started
                // ends with it).
                drop(source);
                let letters = match LetterReplay::new(streams.clone(), &held) {
                    Ok(l) => l,
                    Err(e) => return fail((exit::CONFIG, e)),
                };
                let counts: Vec<String> = letters.counts().iter().map(|(s, n)| format!("{s}: {n}")).collect();
                info!(
                    letters = %counts.join(", "),
                    "replaying the dead letters the destination holds (those replayed before are passed over)"
                );
                (Box::new(Paused::new(streams.clone())), Box::new(letters))
            }
        };
        let (skips, batch_skips) = match skip_requests(&cfg, &streams) {
            Ok(skips) => skips,
            Err(e) => return fail((exit::CONFIG, e)),
        };
        stream_names.clone_from(&streams);
        let host_config = HostConfig {
            // Per run: it seeds retry jitter and the low half of the writer epoch.
            seed: run_seed(),
            sources: source_names(),
            sinks: vec!["sink".into()],
            streams: streams.clone(),
            limits: limits(&cfg),
            stop_when_exhausted: cfg.once || mode == Mode::Replay,
            schema_plugin: cfg.schema_command.is_some(),
            lease: cfg.lease_table.as_ref().map(|_| lease_config(cfg.lease_seconds)),
            cluster: cluster.as_ref().map(|c| c.config.clone()),
            mutations: Mutations::NONE,
            skips,
            batch_skips,
            dead_letters: cfg.dead_letter.as_ref().map(|d| d.limits),
            wall_origin_ms: clock.wall_origin_ms(),
        };
        let host = match Host::new(host_config, clock.now()) {
            Ok(h) => h,
            Err(e) => return fail((exit::CONFIG, e.to_string())),
        };
        let backends = Backends {
            wal: wal.clone(),
            offsets: offsets.clone(),
            lease: lease.clone(),
            sources: vec![Arc::new(Mutex::new(source)) as SharedSource, Arc::new(Mutex::new(replay)) as SharedSource],
            sinks: vec![Arc::new(Mutex::new(sink)) as SharedSink],
            dead_letters,
            streams: Arc::new(skippr_io::driver::StreamNames::new(streams)),
            sink_names: vec!["sink".into()],
            schema,
            metrics: Arc::clone(&metrics),
            place: place.root(),
            endpoints: endpoints.clone(),
            peers: cluster.as_ref().map(|c| Arc::clone(&c.peers)),
            record_bytes_max: cfg.record_bytes_max,
            skips: Default::default(),
        };
        let incoming = cluster.as_mut().map(|c| &mut c.incoming);
        let reason = drive(host, backends, clock, &mut shutdown, incoming, Arc::clone(&totals)).await;
        // A clustered engine stops when it loses leadership or installs a
        // snapshot, dropping everything it held; it starts again as a
        // follower from what its disk holds (crash-only).
        if cluster.is_some() && reason.restarts_as_follower() && !totals.shutdown.load(Ordering::Relaxed) {
            info!("{}; starting again as a follower", explain(&reason, &place));
            continue;
        }
        break reason;
    };
    if let Some(c) = &cluster {
        c.peers.flush(std::time::Duration::from_secs(1)).await;
    }
    let code = exit::for_stop(&reason);
    let mut message = explain(&reason, &place);
    if let StopReason::SinkFatal { stream, seq, .. } = &reason {
        // The way past it that needs no fix of the destination.
        let name = stream_names.get(stream.0 as usize).map_or("?", String::as_str);
        message = format!(
            "{message}. Or give that batch up (its records go to neither the sink nor the dead letters; recorded in \
             the WAL): start again with --skip-batch {name}:{} --skip-reason TEXT",
            seq.0
        );
    }
    if matches!(reason, StopReason::OffsetsAheadOfWal { .. } | StopReason::SinkAheadOfWal { .. })
        && cfg.wal == WalConfig::Disk
    {
        if let Some(tail) = crate::tools::disk_wal_tail(&cfg.data_dir) {
            message = format!("{message}. {tail}");
        }
    }
    if matches!(reason, StopReason::FinishedUnconfirmed { .. }) {
        warn!("{message}");
    } else if code == exit::OK {
        info!("{message}");
    } else {
        error!("{message}");
        eprintln!("{}: {message}", mode.command());
    }
    let elapsed = started.elapsed().as_secs_f64();
    let records = totals.records.load(Ordering::Relaxed);
    // Ack latency: how long a source batch waited for its commit; and the
    // window from the first read to the last ack (start-up, an election and
    // the drain left out).
    let acks = match totals.acks.summary() {
        Some(a) => format!(
            "ack p50: {:.2}ms, ack p99: {:.2}ms, acked in: {:.3}s",
            a.p50.as_secs_f64() * 1e3,
            a.p99.as_secs_f64() * 1e3,
            a.window.as_secs_f64()
        ),
        None => "ack p50: -, ack p99: -, acked in: -".to_string(),
    };
    // What this run committed: the records acknowledged to their sources.
    // After a clean stop that is every record read.
    let committed = match totals.acks.committed_records() {
        (n, true) => n.to_string(),
        (n, false) => format!("at least {n}"),
    };
    println!(
        "records: {records}, committed: {committed}, commits: {}, compactions: {}, elapsed: {elapsed:.2}s, records/s: \
         {:.0}, wal bytes: {}, {acks}",
        totals.commits.load(Ordering::Relaxed),
        totals.compactions.load(Ordering::Relaxed),
        records as f64 / elapsed.max(1e-9),
        totals.wal_bytes.load(Ordering::Relaxed)
    );
    if code != exit::OK {
        warn!(code, "exiting with an error code");
    }
    code
}

type Stores = (WalBackend, OffsetsBackend, Option<Arc<Dynamo>>, WalPlace, Option<String>, S3Targets);

/// The buckets the S3 sink and the `s3` dead-letter destination write to,
/// checked at start.
#[derive(Default)]
struct S3Targets {
    sink: Option<S3SinkTarget>,
    letters: Option<S3SinkTarget>,
}

/// Opens the WAL, the offsets store and the lease table, checking that the
/// bucket and table exist before anything runs.
async fn open_stores(cfg: &RunConfig) -> Result<Stores, (i32, String)> {
    let remote = |e: String| (exit::REMOTE, e);
    let needs_aws = matches!(cfg.wal, WalConfig::S3 { .. })
        || cfg.offsets != OffsetsConfig::Disk
        || matches!(cfg.sink, SinkConfig::S3(_))
        || matches!(&cfg.dead_letter, Some(DeadLetterConfig { to: DeadLetterTo::S3(_), .. }));
    let sdk = match needs_aws {
        true => Some(cfg.aws.load().await.map_err(remote)?),
        false => None,
    };
    // Where requests go, named before the first one is sent.
    let endpoints = sdk.as_ref().map(|sdk| {
        let s3 = skippr_io::aws::endpoint_label(skippr_io::aws::s3_endpoint(sdk), sdk);
        let dynamodb = skippr_io::aws::endpoint_label(skippr_io::aws::dynamodb_endpoint(sdk), sdk);
        info!(s3 = %s3, dynamodb = %dynamodb, "AWS endpoints");
        format!("s3 {s3}, dynamodb {dynamodb}")
    });
    let (wal, place) = match &cfg.wal {
        WalConfig::Disk | WalConfig::Clustered(_) => {
            let wal = DiskWal::open(&cfg.data_dir)
                .map_err(|e| (exit::DATA_DIR, format!("cannot open the WAL under {}: {e}", cfg.data_dir.display())))?;
            let place = WalPlace::Dir(wal.dir().to_path_buf());
            (WalBackend::Disk(Arc::new(wal)), place)
        }
        WalConfig::S3 { bucket, prefix } => {
            let wal = S3Wal::connect(sdk.as_ref().expect("loaded"), bucket, prefix).await.map_err(remote)?;
            wal.probe_conditional_puts(run_seed()).await.map_err(remote)?;
            let place = WalPlace::S3(wal.location());
            (WalBackend::S3(Arc::new(wal)), place)
        }
    };
    let sources = source_names();
    let identity = wal_identity(cfg)?;
    let dynamo = |table: String| {
        let (sdk, sources, location) = (sdk.clone(), sources.clone(), identity.clone());
        async move {
            let sdk = sdk.expect("loaded");
            Dynamo::connect(&sdk, &table, &cfg.pipeline, sources, &location).await.map(Arc::new)
        }
    };
    let lease = match &cfg.lease_table {
        Some(table) => Some(dynamo(table.clone()).await.map_err(remote)?),
        None => None,
    };
    let offsets = match &cfg.offsets {
        OffsetsConfig::Disk => {
            let db = OffsetsDb::open(&cfg.data_dir, &cfg.pipeline, sources.clone()).map_err(|e| {
                (exit::DATA_DIR, format!("cannot open the offsets store under {}: {e}", cfg.data_dir.display()))
            })?;
            OffsetsBackend::Disk(Arc::new(db))
        }
        OffsetsConfig::Dynamodb { table } if Some(table) == cfg.lease_table.as_ref() => {
            OffsetsBackend::Dynamo(Arc::clone(lease.as_ref().expect("opened above")))
        }
        OffsetsConfig::Dynamodb { table } => OffsetsBackend::Dynamo(dynamo(table.clone()).await.map_err(remote)?),
    };
    let mut s3 = S3Targets::default();
    if let SinkConfig::S3(t) = &cfg.sink {
        let target = S3SinkTarget::connect(sdk.as_ref().expect("loaded"), &t.bucket, &t.prefix, t.gzip).await;
        s3.sink = Some(target.map_err(remote)?);
    }
    if let Some(DeadLetterConfig { to: DeadLetterTo::S3(t), .. }) = &cfg.dead_letter {
        let target = S3SinkTarget::connect(sdk.as_ref().expect("loaded"), &t.bucket, &t.prefix, t.gzip).await;
        s3.letters = Some(target.map_err(|e| (exit::REMOTE, format!("the dead-letter destination: {e}")))?);
    }
    Ok((wal, offsets, lease, place, endpoints, s3))
}

/// What names this WAL in stores shared with others (DynamoDB offsets, a
/// sink's keys): its bucket and prefix, the identity kept in DATA_DIR, or
/// its cluster.
fn wal_identity(cfg: &RunConfig) -> Result<String, (i32, String)> {
    Ok(match &cfg.wal {
        WalConfig::S3 { bucket, prefix } => skippr_io::dynamo::wal_identity(Some((bucket, prefix)), &cfg.data_dir),
        // Kept in DATA_DIR, so that a WAL moved elsewhere is still itself.
        WalConfig::Disk => skippr_io::disk_wal::wal_identity(&cfg.data_dir, run_seed()).map_err(|e| {
            let file = cfg.data_dir.join(skippr_io::disk_wal::IDENTITY_FILE);
            (exit::DATA_DIR, format!("cannot read or make the WAL's identity {}: {e}", file.display()))
        })?,
        // Every host writes the same keys: the cluster's, not a directory's.
        WalConfig::Clustered(_) => crate::cluster::wal_identity(&cfg.data_dir).map_err(|e| (exit::CONFIG, e))?,
    })
}

/// The steal span from `SKIPPR_LEASE_SECONDS`; core derives the rest.
fn lease_config(seconds: f64) -> LeaseConfig {
    LeaseConfig::from_span(Duration::from_micros((seconds * 1e6) as u64))
}

/// A seed from the operating system's randomness (the shell may use it; the
/// engine and the simulator may not).
fn run_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

fn limits(cfg: &RunConfig) -> Limits {
    Limits {
        segment_age_max: Duration::from_micros((cfg.wal_max_delay_seconds * 1e6) as u64),
        drain_timeout: Duration::from_micros((cfg.drain_timeout_seconds * 1e6) as u64),
        stall_report_after: Some(Duration::from_micros((cfg.stall_seconds * 1e6) as u64)),
        stall_stop_after: cfg.stall_exit_seconds.map(|s| Duration::from_micros((s * 1e6) as u64)),
        wal_bytes_max: cfg.wal_max_bytes,
        record_cache_bytes: cfg.record_cache_bytes,
        ..Limits::for_segment_bytes(cfg.wal_bytes_per_file)
    }
}

/// `--skip-input` and `--skip-batch`, for the engine: the stream must be
/// one the source has.
fn skip_requests(cfg: &RunConfig, streams: &[String]) -> Result<(Vec<SkipRequest>, Vec<BatchSkipRequest>), String> {
    let stream = |option: &str, name: &str, message: &str| {
        let Some(index) = streams.iter().position(|s| s == name) else {
            return Err(format!(
                "{option} names stream {name:?}, which this source does not have (it has {}): copy the option from \
                 the {message}",
                streams.join(", ")
            ));
        };
        Ok(StreamId(index as u16))
    };
    let reason =
        |option: &str| cfg.skip_reason.clone().unwrap_or_else(|| format!("given up by the operator (run {option})"));
    let skips = cfg.skips.iter().map(|skip: &InputSkip| {
        Ok(SkipRequest {
            key: PartitionKey { source: SourceId(0), partition: skip.partition },
            stream: stream("--skip-input", &skip.stream, "refusal message")?,
            at: Position(skip.at),
            next: Position(skip.next),
            reason: reason("--skip-input"),
        })
    });
    let batch_skips = cfg.batch_skips.iter().map(|skip: &BatchSkip| {
        Ok(BatchSkipRequest {
            sink: SinkId(0),
            stream: stream("--skip-batch", &skip.stream, "stop message")?,
            seq: CompactionSeq(skip.seq),
            reason: reason("--skip-batch"),
        })
    });
    Ok((skips.collect::<Result<_, String>>()?, batch_skips.collect::<Result<_, String>>()?))
}
