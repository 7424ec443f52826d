//! Singer taps as a source: the host runs the tap and reads its `SCHEMA`,
//! `RECORD` and `STATE` messages; the engine's windows (section 22 of
//! docs/ARCHITECTURE.md) make it exactly once.
//!
//! Each Singer stream is a partition (the 31-bit name hash the file source
//! uses) and a stream of the WAL. A record's position is a per-partition
//! count that only grows, across runs and restarts of the tap. The records
//! between two `STATE` messages are a *window*: handed to the host as they
//! come (`Window::Open`), committed to the WAL, and taken as read only when
//! the `STATE` that closes them commits (`Window::Close`, the state as the
//! checkpoint of every partition the window holds). Each time the tap
//! starts, the host is told first (`Window::Restart`): a window left open
//! (the tap died, or ended without a last `STATE`) is void, and the records
//! the tap sends again from its state are new ones at new positions. With
//! each record goes its *resume key*, a hash of its replication-key value
//! (the `SCHEMA`'s `bookmark_properties`, or the catalog's
//! `replication-key`): after a restart the engine drops the records that
//! are byte for byte ones committed last under the same key (the bookmark
//! rule), so a tap that resumes inclusively (`>=`, as the Singer SDK's SQL
//! taps do) sends nothing twice.
//!
//! Taps end when their sync ends; the next run starts `interval` after the
//! last one ended, from the last state handed to the host (after a restart
//! of the daemon, from the committed one), written to a file passed as
//! `--state`.

pub mod settings;

use super::lines::{log_stderr, stdout_lines, Line, Lines};
use super::process::clip;
use super::{Batch, PluginError, Source};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use skippr_core::format::Record;
use skippr_core::{Position, ResumePoint, Window};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How a Singer tap is run.
#[derive(Clone, Debug)]
pub struct SingerSettings {
    /// The tap and its own arguments (`tap-x --config tap.json`), run by `sh -c`.
    pub command: String,
    /// Passed as `--catalog`; its selected streams are the source's streams.
    pub catalog: Option<PathBuf>,
    /// Passed as `--properties` (older taps); read like a catalog.
    pub properties: Option<PathBuf>,
    /// Between the end of one run and the start of the next; `None` runs the
    /// tap once (the source is then exhausted).
    pub interval: Option<Duration>,
    /// A tap silent this long while it runs is killed.
    pub timeout: Duration,
    /// The largest record (`--record-bytes-max`): a line of the tap may be
    /// this long and 1 MiB more, and a longer one stops the daemon.
    pub record_bytes_max: u64,
}

impl SingerSettings {
    fn line_bytes_max(&self) -> usize {
        self.record_bytes_max as usize + (1 << 20)
    }
}

/// Bytes of the tap's lines read ahead of the source, at most (or one line).
const QUEUE_BYTES: usize = 8 << 20;

/// A stream as the catalog (or discovery) declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SingerStream {
    /// The tap's name for it (`tap_stream_id`, else `stream`).
    pub tap_name: String,
    /// The name in the WAL and at sinks: the tap's, with characters other
    /// than letters, digits, '-' and '_' made '_'.
    pub name: String,
    pub key_properties: Vec<String>,
    /// The catalog's replication key (`replication-key` in the stream's
    /// metadata, or `replication_key`), if it names one.
    pub replication_key: Option<String>,
}

/// A window's checkpoint: its number and the tap's state. Checkpoints of
/// earlier versions also carry each partition's end at the state and the
/// window before (`ends`, `prev`): read only, to resume from a window an
/// earlier version committed in part.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Checkpoint {
    k: u64,
    state: Option<Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    ends: BTreeMap<u32, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prev: Option<Box<Checkpoint>>,
}

struct Run {
    child: Child,
    lines: Lines,
    last_line: Instant,
    state_file: Option<PathBuf>,
    /// The host has not yet been told that the tap started.
    announce: bool,
}

pub struct SingerSource {
    settings: SingerSettings,
    streams: Vec<SingerStream>,
    /// Partition by the tap's stream name.
    partitions: BTreeMap<String, u32>,
    run: Option<Run>,
    next_run: Option<Instant>,
    exhausted: bool,
    /// The number of the last window handed to the host, and its state:
    /// what the tap starts from.
    k: u64,
    state: Option<Value>,
    /// Next position per partition.
    next: BTreeMap<u32, u64>,
    /// Batches of this read, ready; and per partition the one being filled.
    ready: Vec<Batch>,
    filling: BTreeMap<u32, Batch>,
    /// Records in this read so far.
    taken: usize,
    /// The schema a partition's next batch carries (a `SCHEMA` since its last).
    schemas: BTreeMap<u32, Vec<u8>>,
    /// Per partition, the field whose value is a record's resume key.
    resume_keys: BTreeMap<u32, String>,
    runs: u64,
    /// Why the source cannot go on (a line past the limit).
    refused: Option<String>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    stream: Option<String>,
    #[serde(borrow, default)]
    record: Option<&'a RawValue>,
    #[serde(borrow, default)]
    schema: Option<&'a RawValue>,
    #[serde(default)]
    value: Option<Value>,
    #[serde(default)]
    bookmark_properties: Option<Vec<String>>,
}

/// A record's resume key: the hash of its `field`'s value as the tap wrote
/// it, or `None` without that field (or not an object). Field names are
/// borrowed where they can be; one written with an escape is read again
/// owned.
fn resume_key(record: &RawValue, field: &str) -> Option<u64> {
    let value = match serde_json::from_str::<BTreeMap<&str, &RawValue>>(record.get()) {
        Ok(fields) => *fields.get(field)?,
        Err(_) => *serde_json::from_str::<BTreeMap<String, &RawValue>>(record.get()).ok()?.get(field)?,
    };
    Some(xxhash_rust::xxh3::xxh3_64(value.get().as_bytes()))
}

impl SingerSource {
    /// Learns the tap's streams from its catalog (or properties) file, or by
    /// running it with `--discover`.
    pub fn start(settings: SingerSettings) -> Result<SingerSource, PluginError> {
        let catalog = match settings.catalog.as_ref().or(settings.properties.as_ref()) {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| PluginError(format!("cannot read the Singer catalog {}: {e}", path.display())))?,
            None => discover(&settings)?,
        };
        SingerSource::with_streams(settings, parse_catalog(&catalog)?)
    }

    /// A source for these streams (each given a partition), not started.
    fn with_streams(settings: SingerSettings, streams: Vec<SingerStream>) -> Result<SingerSource, PluginError> {
        let mut partitions = BTreeMap::new();
        let mut by_partition: BTreeMap<u32, &str> = BTreeMap::new();
        let mut names = BTreeSet::new();
        let mut resume_keys = BTreeMap::new();
        for s in &streams {
            let p = super::FileSource::partition_of(&s.tap_name);
            if let Some(other) = by_partition.insert(p, &s.tap_name) {
                return Err(PluginError(format!(
                    "the tap's streams {other:?} and {:?} hash to the same partition; deselect one in the catalog",
                    s.tap_name
                )));
            }
            if !names.insert(s.name.clone()) {
                return Err(PluginError(format!(
                    "two of the tap's streams are both named {:?} once made safe for sinks; deselect one",
                    s.name
                )));
            }
            partitions.insert(s.tap_name.clone(), p);
            if let Some(field) = &s.replication_key {
                resume_keys.insert(p, field.clone());
            }
        }
        info!(streams = ?streams.iter().map(|s| &s.name).collect::<Vec<_>>(), "singer source: streams");
        Ok(SingerSource {
            settings,
            streams,
            partitions,
            run: None,
            next_run: None,
            exhausted: false,
            k: 0,
            state: None,
            next: BTreeMap::new(),
            ready: Vec::new(),
            filling: BTreeMap::new(),
            taken: 0,
            schemas: BTreeMap::new(),
            resume_keys,
            runs: 0,
            refused: None,
        })
    }

    /// The streams with their keys, as the catalog declares them.
    pub fn singer_streams(&self) -> &[SingerStream] {
        &self.streams
    }

    fn stream_name(&self, partition: u32) -> String {
        let tap = self.partitions.iter().find(|(_, p)| **p == partition).map(|(n, _)| n.as_str());
        self.streams.iter().find(|s| Some(s.tap_name.as_str()) == tap).map(|s| s.name.clone()).unwrap_or_default()
    }

    /// Ends the run; says how it ended, and whether that was a clean exit.
    fn stop_run(&mut self) -> (String, bool) {
        let Some(mut run) = self.run.take() else { return ("was not running".into(), false) };
        if let Some(f) = run.state_file.take() {
            let _ = std::fs::remove_file(f);
        }
        for _ in 0..40 {
            if !matches!(run.child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        match run.child.try_wait() {
            Ok(Some(status)) => (format!("exited ({status})"), status.success()),
            _ => {
                super::spawner::kill_tree(&mut run.child);
                ("was killed".into(), false)
            }
        }
    }

    /// Drops what this read gathered and not yet handed over.
    fn drop_gathered(&mut self) -> usize {
        let n = self.ready.iter().chain(self.filling.values()).map(|b| b.records.len()).sum();
        self.ready.clear();
        self.filling.clear();
        self.taken = 0;
        n
    }

    fn fail(&mut self, what: String) -> PluginError {
        let (status, _) = self.stop_run();
        self.drop_gathered();
        let e = PluginError(format!(
            "singer tap: {what}; it {status}; what it sent after its last STATE is void and comes again from that \
             state"
        ));
        warn!("{e}");
        e
    }

    fn launch(&mut self) -> Result<(), PluginError> {
        let mut command = self.settings.command.clone();
        let mut state_file = None;
        if let Some(state) = &self.state {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let path = std::env::temp_dir().join(format!(
                "skipprd-singer-state-{}-{}-{nanos}.json",
                std::process::id(),
                self.runs
            ));
            let mut f = std::fs::OpenOptions::new();
            // A new file, never one planted under the name.
            f.write(true).create_new(true);
            std::os::unix::fs::OpenOptionsExt::mode(&mut f, 0o600);
            f.open(&path)
                .and_then(|mut file| file.write_all(&serde_json::to_vec(state).expect("a JSON value serializes")))
                .map_err(|e| PluginError(format!("cannot write the tap's state file {}: {e}", path.display())))?;
            command.push_str(&format!(" --state {}", shell_quote(&path.to_string_lossy())));
            state_file = Some(path);
        }
        if let Some(c) = &self.settings.catalog {
            command.push_str(&format!(" --catalog {}", shell_quote(&c.to_string_lossy())));
        }
        if let Some(p) = &self.settings.properties {
            command.push_str(&format!(" --properties {}", shell_quote(&p.to_string_lossy())));
        }
        self.runs += 1;
        let (child, lines) = match spawn_lines(&command, self.settings.line_bytes_max()) {
            Ok(started) => started,
            Err(e) => {
                if let Some(f) = state_file {
                    let _ = std::fs::remove_file(f);
                }
                return Err(e);
            }
        };
        info!(pid = child.id(), from_window = self.k, "singer tap started");
        self.run = Some(Run { child, lines, last_line: Instant::now(), state_file, announce: true });
        Ok(())
    }

    /// A batch of `partition` that carries no record (a restart or a close).
    fn empty_batch(&self, partition: u32, window: Window, checkpoint: Option<Vec<u8>>) -> Batch {
        Batch {
            partition,
            stream: self.stream_name(partition),
            records: Vec::new(),
            end: Position(self.next.get(&partition).copied().unwrap_or(0)),
            checkpoint,
            schema: None,
            window,
            keys: Vec::new(),
        }
    }

    /// Any partition of the source: a batch with no record names one.
    fn some_partition(&self) -> u32 {
        self.partitions.values().copied().min().expect("a Singer source has a stream")
    }

    /// One line of the tap; true when it closed a window.
    fn take_line(&mut self, line: &str) -> Result<bool, PluginError> {
        let message: Message = match serde_json::from_str(line) {
            Ok(m) => m,
            Err(e) => {
                return Err(self.fail(format!("printed a line that is not a Singer message ({e}): {}", clip(line))))
            }
        };
        let partition = |me: &mut Self, m: &Message| -> Result<u32, PluginError> {
            let Some(stream) = &m.stream else {
                return Err(me.fail(format!("sent a {} without a stream: {}", m.kind, clip(line))));
            };
            match me.partitions.get(stream) {
                Some(p) => Ok(*p),
                None => Err(me.fail(format!(
                    "sent a {} of the stream {stream:?}, which its catalog does not select; \
                     select it in the catalog (--singer-catalog), or deselect it in the tap",
                    m.kind
                ))),
            }
        };
        match message.kind.as_str() {
            "RECORD" => {
                let p = partition(self, &message)?;
                let Some(record) = message.record else {
                    return Err(self.fail(format!("sent a RECORD without a record: {}", clip(line))));
                };
                let key = self.resume_keys.get(&p).and_then(|field| resume_key(record, field));
                let position = self.next.entry(p).or_default();
                let at = Position(*position);
                *position += 1;
                let end = Position(*position);
                if !self.filling.contains_key(&p) {
                    let mut batch = self.empty_batch(p, Window::Open, None);
                    batch.schema = self.schemas.remove(&p);
                    self.filling.insert(p, batch);
                }
                let batch = self.filling.get_mut(&p).expect("inserted above");
                batch.records.push(Record { position: at, bytes: record.get().as_bytes().to_vec() });
                batch.keys.push(key);
                batch.end = end;
                self.taken += 1;
                Ok(false)
            }
            "SCHEMA" => {
                let p = partition(self, &message)?;
                if let Some(schema) = message.schema {
                    // Records before it went under the schema before.
                    if let Some(batch) = self.filling.remove(&p) {
                        self.ready.push(batch);
                    }
                    self.schemas.insert(p, schema.get().as_bytes().to_vec());
                }
                if let Some(field) = message.bookmark_properties.and_then(|b| b.into_iter().next()) {
                    self.resume_keys.insert(p, field);
                }
                Ok(false)
            }
            "STATE" => {
                let Some(value) = message.value else {
                    return Err(self.fail(format!("sent a STATE without a value: {}", clip(line))));
                };
                self.close_window(value);
                Ok(true)
            }
            // ACTIVATE_VERSION, BATCH and newer kinds carry nothing this
            // source acts on.
            _ => Ok(false),
        }
    }

    /// The window closed by `state`: what it gathered, then the close.
    fn close_window(&mut self, state: Value) {
        let filled = std::mem::take(&mut self.filling);
        self.ready.extend(filled.into_values());
        self.k += 1;
        let checkpoint = Checkpoint { k: self.k, state: Some(state), ends: BTreeMap::new(), prev: None };
        let bytes = serde_json::to_vec(&checkpoint).expect("a checkpoint serializes");
        self.state = checkpoint.state;
        let close = self.empty_batch(self.some_partition(), Window::Close, Some(bytes));
        self.ready.push(close);
    }

    /// What this read gathered, handed over.
    fn hand_over(&mut self) -> Vec<Batch> {
        let filled = std::mem::take(&mut self.filling);
        self.ready.extend(filled.into_values());
        self.taken = 0;
        std::mem::take(&mut self.ready)
    }
}

impl Source for SingerSource {
    fn streams(&self) -> Vec<String> {
        self.streams.iter().map(|s| s.name.clone()).collect()
    }

    fn open(&mut self, resume: &[ResumePoint]) -> Result<(), PluginError> {
        self.stop_run();
        self.drop_gathered();
        self.schemas.clear();
        self.exhausted = false;
        self.refused = None;
        self.next_run = None;
        let resumed = resume_from(resume)?;
        self.next = resumed.at;
        info!(window = resumed.k, partitions = self.next.len(), "singer source: resuming from the committed state");
        self.k = resumed.k;
        self.state = resumed.state;
        Ok(())
    }

    fn read(&mut self, records_max: u32) -> Result<(Vec<Batch>, bool), PluginError> {
        if self.exhausted {
            return Ok((Vec::new(), true));
        }
        if self.run.is_none() {
            if self.next_run.is_some_and(|t| Instant::now() < t) {
                return Ok((Vec::new(), false));
            }
            self.launch()?;
        }
        if self.run.as_mut().is_some_and(|r| std::mem::take(&mut r.announce)) {
            // The tap starts over from its state: whatever the host holds
            // of a window after it is void.
            let restart = self.empty_batch(self.some_partition(), Window::Restart, None);
            self.ready.push(restart);
        }
        let deadline = Instant::now() + Duration::from_millis(200);
        loop {
            if self.taken >= records_max as usize {
                return Ok((self.hand_over(), false));
            }
            let run = self.run.as_mut().expect("launched above");
            let wait = deadline.saturating_duration_since(Instant::now());
            match run.lines.recv_timeout(wait) {
                Ok(Line::Text(line)) => {
                    run.last_line = Instant::now();
                    if line.trim().is_empty() {
                        continue;
                    }
                    if self.take_line(&line)? {
                        return Ok((self.hand_over(), false));
                    }
                }
                Ok(Line::NotUtf8(lossy)) => {
                    return Err(self.fail(format!("printed a line that is not UTF-8: {lossy}")));
                }
                Ok(Line::TooLong { bytes_max }) => {
                    // The tap would send the same line on every run.
                    let why = format!(
                        "the Singer tap printed a line longer than {bytes_max} bytes: a record may be at most \
                         --record-bytes-max ({}) bytes; raise it, or keep such records out of the tap's output",
                        self.settings.record_bytes_max
                    );
                    self.refused = Some(why.clone());
                    return Err(self.fail(why));
                }
                Ok(Line::End) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let (status, clean) = self.stop_run();
                    // Records after the last STATE: those handed over stay
                    // in an open window, void when the tap starts again.
                    let dropped = self.drop_gathered();
                    if !clean {
                        let e = PluginError(format!(
                            "singer tap {status}; what it sent after its last STATE is void and comes again from \
                             that state"
                        ));
                        warn!("{e}");
                        return Err(e);
                    }
                    if dropped > 0 {
                        warn!(
                            dropped,
                            "singer tap ended with records after its last STATE; they come again on the next run"
                        );
                    }
                    match self.settings.interval {
                        None => {
                            info!("singer tap finished its sync; running once, the source is done");
                            self.exhausted = true;
                            return Ok((Vec::new(), true));
                        }
                        Some(every) => {
                            info!(next_in = ?every, "singer tap finished its sync");
                            self.next_run = Some(Instant::now() + every);
                            return Ok((Vec::new(), false));
                        }
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let silent = run.last_line.elapsed();
                    if silent > self.settings.timeout {
                        let timeout = self.settings.timeout;
                        return Err(
                            self.fail(format!("sent nothing for {silent:?} (more than --plugin-timeout {timeout:?})"))
                        );
                    }
                    return Ok((self.hand_over(), false));
                }
            }
        }
    }

    fn ack(&mut self, _acks: &[(u32, Position)]) -> Result<(), PluginError> {
        Ok(())
    }

    fn refused(&self) -> Option<String> {
        self.refused.clone()
    }

    fn describe(&self, partition: u32, position: Position) -> String {
        format!("record number {} (from 0) the tap sent of stream {:?}", position.0, self.stream_name(partition))
    }
}

impl Drop for SingerSource {
    fn drop(&mut self) {
        self.stop_run();
    }
}

/// Where a resume starts.
struct Resumed {
    /// The newest window committed, and its state.
    k: u64,
    state: Option<Value>,
    /// The next position of every partition.
    at: BTreeMap<u32, u64>,
}

fn resume_from(resume: &[ResumePoint]) -> Result<Resumed, PluginError> {
    let mut newest: Option<Checkpoint> = None;
    for r in resume {
        let Some(bytes) = &r.checkpoint else { continue };
        let c: Checkpoint = serde_json::from_slice(bytes).map_err(|e| {
            PluginError(format!(
                "partition {}'s checkpoint is not a Singer source's ({e}); was this WAL written by another source?",
                r.partition
            ))
        })?;
        if newest.as_ref().is_none_or(|n| c.k > n.k) {
            newest = Some(c);
        }
    }
    let at: BTreeMap<u32, u64> = resume.iter().map(|r| (r.partition, r.position.0)).collect();
    // No checkpoint: nothing committed yet (a void window moves positions
    // on without one).
    let Some(newest) = newest else { return Ok(Resumed { k: 0, state: None, at }) };
    // An earlier version could commit a window in part (a crash between
    // its commit groups): its checkpoint names every partition's end at
    // its state, and the tap resumes from the window before if some
    // partition did not reach it. What it sends again is then new: the
    // bookmark rule or an upserting sink keeps it once.
    let whole = newest.ends.iter().all(|(p, end)| at.get(p).copied().unwrap_or(0) >= *end);
    let from = match whole {
        true => newest.clone(),
        false => {
            warn!("singer source: a WAL of an earlier version holds a window in part; the tap resumes from the state before it");
            newest.prev.clone().map(|p| *p).unwrap_or(Checkpoint {
                k: 0,
                state: None,
                ends: BTreeMap::new(),
                prev: None,
            })
        }
    };
    Ok(Resumed { k: newest.k, state: from.state, at })
}

/// The streams of a catalog: the selected ones (all, if none says).
pub fn parse_catalog(text: &str) -> Result<Vec<SingerStream>, PluginError> {
    let bad = |what: String| PluginError(format!("the Singer catalog {what}"));
    let catalog: Value = serde_json::from_str(text).map_err(|e| bad(format!("is not JSON ({e})")))?;
    let entries =
        catalog.get("streams").and_then(Value::as_array).ok_or_else(|| bad("has no `streams` list".into()))?;
    let top = |e: &Value| -> Option<Value> {
        e.get("metadata")?
            .as_array()?
            .iter()
            .find(|m| m.get("breadcrumb").and_then(Value::as_array).is_some_and(|b| b.is_empty()))?
            .get("metadata")
            .cloned()
    };
    let any_selected =
        entries.iter().any(|e| e.get("selected").is_some() || top(e).is_some_and(|m| m.get("selected").is_some()));
    let mut streams = Vec::new();
    for e in entries {
        let meta = top(e);
        let selected = e.get("selected").and_then(Value::as_bool).or_else(|| meta.as_ref()?.get("selected")?.as_bool());
        if any_selected && selected != Some(true) {
            continue;
        }
        let tap_name = e
            .get("tap_stream_id")
            .or_else(|| e.get("stream"))
            .and_then(Value::as_str)
            .ok_or_else(|| bad("lists a stream without `tap_stream_id` or `stream`".into()))?
            .to_string();
        let keys = e
            .get("key_properties")
            .or_else(|| meta.as_ref()?.get("table-key-properties"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
            .unwrap_or_default();
        let replication_key = e
            .get("replication_key")
            .or_else(|| meta.as_ref()?.get("replication-key"))
            .and_then(Value::as_str)
            .map(String::from);
        let name: String =
            tap_name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        skippr_core::rules::check_stream_name(&name)
            .map_err(|why| bad(format!("selects the stream {:?}, refused: {why}", super::process::clip(&tap_name))))?;
        streams.push(SingerStream { tap_name, name, key_properties: keys, replication_key });
    }
    if streams.is_empty() {
        return Err(bad("selects no stream: mark one `\"selected\": true`".into()));
    }
    Ok(streams)
}

/// Runs the tap with `--discover` and returns what it prints.
fn discover(settings: &SingerSettings) -> Result<String, PluginError> {
    let command = format!("{} --discover", settings.command);
    let (mut child, lines) = spawn_lines(&command, settings.line_bytes_max())?;
    let mut out = String::new();
    let deadline = Instant::now() + settings.timeout.max(Duration::from_secs(30));
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Line::Text(l)) => {
                out.push_str(&l);
                out.push('\n');
            }
            Ok(Line::NotUtf8(lossy)) => {
                super::spawner::kill_tree(&mut child);
                return Err(PluginError(format!("`{command}` printed a line that is not UTF-8: {lossy}")));
            }
            Ok(Line::TooLong { bytes_max }) => {
                super::spawner::kill_tree(&mut child);
                return Err(PluginError(format!("`{command}` printed a line longer than {bytes_max} bytes")));
            }
            Ok(Line::End) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                super::spawner::kill_tree(&mut child);
                return Err(PluginError(format!("`{command}` did not finish within {:?}", settings.timeout)));
            }
        }
    }
    let status = child.wait().map_err(|e| PluginError(format!("`{command}`: {e}")))?;
    if !status.success() {
        return Err(PluginError(format!(
            "`{command}` {status} (its log is above); give the tap's catalog with --singer-catalog instead"
        )));
    }
    Ok(out)
}

/// Starts `sh -c command` under a watchdog (`spawner`), its stdout read as
/// lines of at most `line_bytes_max` bytes and its stderr logged.
fn spawn_lines(command: &str, line_bytes_max: usize) -> Result<(Child, Lines), PluginError> {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(command).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = super::spawner::spawn(cmd).map_err(|e| PluginError(format!("cannot start `{command}`: {e}")))?;
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let lines = stdout_lines(stdout, line_bytes_max, QUEUE_BYTES);
    log_stderr(stderr, "singer".into());
    Ok((child, lines))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SingerSettings {
        SingerSettings {
            command: "true".into(),
            catalog: None,
            properties: None,
            interval: None,
            timeout: Duration::from_secs(5),
            record_bytes_max: 4 << 20,
        }
    }

    fn source() -> SingerSource {
        let catalog = r#"{"streams":[{"tap_stream_id":"a","key_properties":["id"],"replication_key":"id"},
            {"tap_stream_id":"b.c"}]}"#;
        SingerSource::with_streams(settings(), parse_catalog(catalog).unwrap()).unwrap()
    }

    fn key_of(value: &str) -> Option<u64> {
        Some(xxhash_rust::xxh3::xxh3_64(value.as_bytes()))
    }

    #[test]
    fn records_go_over_as_they_come_and_a_state_closes_their_window() {
        let mut s = source();
        let a = super::super::FileSource::partition_of("a");
        let bc = super::super::FileSource::partition_of("b.c");
        for i in 0..3 {
            assert!(!s
                .take_line(&format!(r#"{{"type":"RECORD","stream":"a","record":{{"id":{i},"x":"y"}}}}"#))
                .unwrap());
        }
        s.take_line(r#"{"type":"SCHEMA","stream":"b.c","schema":{"type":"object"},"key_properties":[]}"#).unwrap();
        s.take_line(r#"{"type":"RECORD","stream":"b.c","record":{"v":1}}"#).unwrap();
        // A read that stops before the STATE hands over an open window.
        let open = s.hand_over();
        assert_eq!(open.len(), 2);
        assert!(open.iter().all(|b| b.window == Window::Open && b.checkpoint.is_none()));
        let of_a = open.iter().find(|b| b.partition == a).unwrap();
        assert_eq!(of_a.records.iter().map(|r| r.position.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(of_a.keys, vec![key_of("0"), key_of("1"), key_of("2")], "the replication key's value");
        assert_eq!(&of_a.records[0].bytes[..], br#"{"id":0,"x":"y"}"#, "the record object as the tap wrote it");
        let escaped = RawValue::from_string(r#"{"caf\u00e9":1,"id":7}"#.into()).unwrap();
        assert_eq!(resume_key(&escaped, "id"), key_of("7"), "another field's escaped name");
        let of_bc = open.iter().find(|b| b.partition == bc).unwrap();
        assert_eq!((of_bc.stream.as_str(), of_bc.keys.clone()), ("b_c", vec![None]), "no replication key");
        assert_eq!(of_bc.schema.as_deref(), Some(&br#"{"type":"object"}"#[..]));
        // The STATE closes it: the window's number and the state.
        s.take_line(r#"{"type":"RECORD","stream":"a","record":{"id":3}}"#).unwrap();
        assert!(s.take_line(r#"{"type":"STATE","value":{"bookmarks":{"a":3}}}"#).unwrap());
        let closing = s.hand_over();
        assert_eq!(closing.iter().map(|b| b.window).collect::<Vec<_>>(), vec![Window::Open, Window::Close]);
        assert_eq!(closing[0].records[0].position.0, 3, "positions count on");
        let c: Checkpoint = serde_json::from_slice(closing[1].checkpoint.as_ref().unwrap()).unwrap();
        assert_eq!((c.k, c.state), (1, Some(serde_json::json!({"bookmarks":{"a":3}}))));
        assert!(closing[1].records.is_empty());
    }

    #[test]
    fn a_schema_mid_window_starts_a_batch_and_its_bookmark_properties_name_the_resume_key() {
        let mut s = source();
        let bc = super::super::FileSource::partition_of("b.c");
        s.take_line(r#"{"type":"RECORD","stream":"b.c","record":{"v":1,"t":5}}"#).unwrap();
        s.take_line(
            r#"{"type":"SCHEMA","stream":"b.c","schema":{"v":2},"key_properties":[],"bookmark_properties":["t"]}"#,
        )
        .unwrap();
        s.take_line(r#"{"type":"RECORD","stream":"b.c","record":{"v":2,"t":6}}"#).unwrap();
        let batches = s.hand_over();
        assert_eq!(batches.len(), 2);
        assert!(batches.iter().all(|b| b.partition == bc));
        assert_eq!((batches[0].schema.as_deref(), batches[0].keys.clone()), (None, vec![None]));
        assert_eq!(
            (batches[1].schema.as_deref(), batches[1].keys.clone()),
            (Some(&br#"{"v":2}"#[..]), vec![key_of("6")])
        );
    }

    fn point(partition: u32, position: u64, c: Option<&Checkpoint>) -> ResumePoint {
        ResumePoint { partition, position: Position(position), checkpoint: c.map(|c| serde_json::to_vec(c).unwrap()) }
    }

    fn checkpoint(k: u64, ends: &[(u32, u64)], prev: Option<Checkpoint>) -> Checkpoint {
        Checkpoint {
            k,
            state: Some(serde_json::json!({ "k": k })),
            ends: ends.iter().copied().collect(),
            prev: prev.map(Box::new),
        }
    }

    #[test]
    fn a_resume_starts_from_the_newest_state_at_the_committed_positions() {
        let c1 = checkpoint(1, &[], None);
        let c2 = checkpoint(2, &[], None);
        let r = resume_from(&[point(1, 20, Some(&c2)), point(2, 9, Some(&c1)), point(3, 4, None)]).unwrap();
        assert_eq!((r.k, r.state), (2, Some(serde_json::json!({"k": 2}))));
        assert_eq!(
            r.at,
            BTreeMap::from([(1, 20), (2, 9), (3, 4)]),
            "a void window moves a partition without a checkpoint"
        );
        let r = resume_from(&[]).unwrap();
        assert_eq!((r.k, r.state, r.at.len()), (0, None, 0));
        assert!(resume_from(&[ResumePoint { partition: 1, position: Position(3), checkpoint: Some(b"x".to_vec()) }])
            .err()
            .unwrap()
            .0
            .contains("another source"));
    }

    #[test]
    fn a_window_an_earlier_version_committed_in_part_resumes_from_the_state_before_it() {
        // Checkpoints of before windows in the engine: each names the ends
        // at its state, the window before, and a part hash (ignored now).
        let old = r#"{"k":2,"state":{"k":2},"ends":{"1":20,"2":9},"prev":{"k":1,"state":{"k":1},"ends":{"1":10,"2":5}},"part":{"count":10,"hash":7}}"#;
        let old = |position| ResumePoint {
            partition: 1,
            position: Position(position),
            checkpoint: Some(old.as_bytes().to_vec()),
        };
        let c1 = checkpoint(1, &[(1, 10), (2, 5)], None);
        let r = resume_from(&[old(20), point(2, 5, Some(&c1))]).unwrap();
        assert_eq!((r.k, r.state), (2, Some(serde_json::json!({"k": 1}))), "partition 2 never reached state 2");
        let r = resume_from(&[old(20), point(2, 9, Some(&c1))]).unwrap();
        assert_eq!(r.state, Some(serde_json::json!({"k": 2})));
    }

    #[test]
    fn garbage_and_an_unselected_stream_fail_the_read() {
        let mut s = source();
        s.take_line(r#"{"type":"RECORD","stream":"a","record":{"id":1}}"#).unwrap();
        assert!(s.take_line("this is not json").unwrap_err().0.contains("not a Singer message"));
        assert!(s.hand_over().is_empty(), "what the read gathered is dropped");
        assert!(s
            .take_line(r#"{"type":"RECORD","stream":"zzz","record":{}}"#)
            .unwrap_err()
            .0
            .contains("does not select"));
    }

    #[test]
    fn catalogs_select_streams_and_name_their_keys() {
        let c = r#"{"streams":[
            {"tap_stream_id":"users","stream":"users","key_properties":["id"],
             "metadata":[{"breadcrumb":[],"metadata":{"selected":true}}]},
            {"tap_stream_id":"orders","metadata":[{"breadcrumb":[],"metadata":{"selected":false,"table-key-properties":["o"]}}]},
            {"tap_stream_id":"public-items","metadata":[{"breadcrumb":[],"metadata":{"selected":true,
              "table-key-properties":["a","b"],"replication-key":"updated_at"}}]}]}"#;
        let s = parse_catalog(c).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].key_properties.clone(), s[0].replication_key.clone()), (vec!["id".to_string()], None));
        assert_eq!((s[1].name.as_str(), s[1].key_properties.len()), ("public-items", 2));
        assert_eq!(s[1].replication_key.as_deref(), Some("updated_at"));
        assert!(parse_catalog(r#"{"streams":[]}"#).unwrap_err().0.contains("selects no stream"));
        assert!(parse_catalog("nope").unwrap_err().0.contains("not JSON"));
    }
}
