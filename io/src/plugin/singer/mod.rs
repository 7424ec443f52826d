//! Singer taps as a source: the host runs the tap, reads its `SCHEMA`,
//! `RECORD` and `STATE` messages, and commits records only at a `STATE`.
//!
//! Each Singer stream is a partition (the 31-bit name hash the file source
//! uses) and a stream of the WAL. A record's position is a per-partition
//! count that grows across runs. The records between two `STATE` messages
//! (a *window*) are held here, in memory up to `buffer_bytes`, and handed
//! to the host only when the `STATE` that closes the window arrives; what a
//! tap sent after its last `STATE` is dropped when it ends, and comes again
//! on the next run. A tap that holds more than `buffer_bytes` between two
//! states stops the engine (`Source::refused`) with a message naming the
//! limit to raise.
//!
//! The checkpoint, on the last batch of a window of every partition that has
//! records in it, is the window's number `k`, the tap's state, the end
//! position of every partition at that state, and the same for the window
//! before (`prev`). Batches of a window are cut small enough that the host
//! never splits one across commit groups, and the ones before a partition's
//! last carry the previous window's checkpoint, so every committed frame
//! names a state the tap can resume from. On open the source takes the
//! newest checkpoint among the partitions; if some partition has not
//! committed that window's records (a crash between the window's commit
//! groups), it resumes from the window before. WAL groups commit in order,
//! so that one is whole. Each batch's checkpoint also carries the count
//! and hash of its partition's records of the window so far: the first
//! records the tap sends again of a partition are checked against them.
//! The same records keep their positions and the host drops them as held;
//! other records go after what is committed, so nothing is lost, and a sink
//! that does not upsert by the stream's key holds both copies.
//!
//! Taps end when their sync ends; the next run starts `interval` after the
//! last one ended, from the last state handed to the host (after a restart,
//! from the committed one), written to a file passed as `--state`.

pub mod settings;

use super::lines::{log_stderr, stdout_lines, Line, Lines};
use super::process::clip;
use super::{Batch, PluginError, Source};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use skippr_core::format::Record;
use skippr_core::{Position, ResumePoint};
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
    /// Records held between two states, at most.
    pub buffer_bytes: u64,
    /// A tap silent this long while it runs is killed.
    pub timeout: Duration,
    /// A batch handed to the host stays below this many bytes, so that it
    /// commits in one group.
    pub batch_bytes: u64,
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
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Checkpoint {
    k: u64,
    state: Option<Value>,
    ends: BTreeMap<u32, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prev: Option<Box<Checkpoint>>,
    /// On a batch's checkpoint: how many of its partition's records of the
    /// window it belongs to are at or below its end, and their hash; what a
    /// resume checks the tap's re-sent records against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    part: Option<Part>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Part {
    count: u64,
    hash: u64,
}

impl Checkpoint {
    fn none() -> Checkpoint {
        Checkpoint { k: 0, state: None, ends: BTreeMap::new(), prev: None, part: None }
    }
}

/// The running hash of a partition's records in a window.
fn hash_records<'a>(records: impl IntoIterator<Item = &'a Vec<u8>>) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for r in records {
        h.update(&(r.len() as u64).to_le_bytes());
        h.update(r);
    }
    h.digest()
}

struct Run {
    child: Child,
    lines: Lines,
    last_line: Instant,
    state_file: Option<PathBuf>,
}

pub struct SingerSource {
    settings: SingerSettings,
    streams: Vec<SingerStream>,
    /// Partition by the tap's stream name.
    partitions: BTreeMap<String, u32>,
    run: Option<Run>,
    next_run: Option<Instant>,
    exhausted: bool,
    /// The last checkpoint handed to the host (or given at open).
    latest: Checkpoint,
    /// Next position per partition.
    next: BTreeMap<u32, u64>,
    /// The open window: records per partition, and their bytes.
    window: BTreeMap<u32, Vec<Vec<u8>>>,
    window_bytes: u64,
    /// The schema a partition's next batch carries (a `SCHEMA` since its last).
    schemas: BTreeMap<u32, Vec<u8>>,
    runs: u64,
    /// Why the source cannot go on (a window past the buffer).
    refused: Option<String>,
    /// After a resume, per partition: its records committed past the state
    /// the tap resumes from (a window a crash split), their count and hash,
    /// and the committed position. The tap's first records of that
    /// partition are checked against them.
    verify: BTreeMap<u32, (Part, u64)>,
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
        }
        info!(streams = ?streams.iter().map(|s| &s.name).collect::<Vec<_>>(), "singer source: streams");
        Ok(SingerSource {
            settings,
            streams,
            partitions,
            run: None,
            next_run: None,
            exhausted: false,
            latest: Checkpoint::none(),
            next: BTreeMap::new(),
            window: BTreeMap::new(),
            window_bytes: 0,
            schemas: BTreeMap::new(),
            runs: 0,
            refused: None,
            verify: BTreeMap::new(),
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

    /// Drops the open window (never handed to the host).
    fn drop_window(&mut self) -> usize {
        let n = self.window.values().map(Vec::len).sum();
        self.window.clear();
        self.window_bytes = 0;
        n
    }

    fn fail(&mut self, what: String) -> PluginError {
        let (status, _) = self.stop_run();
        let dropped = self.drop_window();
        let e = PluginError(format!("singer tap: {what}; it {status}; {dropped} records after its last STATE are dropped and come again from that state"));
        warn!("{e}");
        e
    }

    fn launch(&mut self) -> Result<(), PluginError> {
        let mut command = self.settings.command.clone();
        let mut state_file = None;
        if let Some(state) = &self.latest.state {
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
        info!(pid = child.id(), from_window = self.latest.k, "singer tap started");
        self.run = Some(Run { child, lines, last_line: Instant::now(), state_file });
        Ok(())
    }

    /// One line of the tap; `Some` when it closed a window.
    fn take_line(&mut self, line: &str) -> Result<Option<Vec<Batch>>, PluginError> {
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
                let bytes = record.get().as_bytes().to_vec();
                self.window_bytes += bytes.len() as u64 + 12;
                if self.window_bytes > self.settings.buffer_bytes {
                    let limit = self.settings.buffer_bytes;
                    let why = format!(
                        "the Singer tap sent more than {limit} bytes of records without a STATE; the records of one \
                         window are held in memory until the STATE that closes it: raise --singer-buffer-bytes (now \
                         {limit}) or make the tap send STATE more often"
                    );
                    self.refused = Some(why.clone());
                    return Err(self.fail(why));
                }
                self.window.entry(p).or_default().push(bytes);
                Ok(None)
            }
            "SCHEMA" => {
                let p = partition(self, &message)?;
                if let Some(schema) = message.schema {
                    self.schemas.insert(p, schema.get().as_bytes().to_vec());
                }
                Ok(None)
            }
            "STATE" => {
                let Some(value) = message.value else {
                    return Err(self.fail(format!("sent a STATE without a value: {}", clip(line))));
                };
                self.close_window(value).map(Some)
            }
            // ACTIVATE_VERSION, BATCH and newer kinds carry nothing this
            // source acts on.
            _ => Ok(None),
        }
    }

    /// The window closed by `state`, as batches: each under the batch size,
    /// the last of a partition with the new checkpoint, the others with the
    /// one before.
    fn close_window(&mut self, state: Value) -> Result<Vec<Batch>, PluginError> {
        let window = std::mem::take(&mut self.window);
        self.window_bytes = 0;
        let mut prev = self.latest.clone();
        prev.prev = None;
        let mut ends = self.next.clone();
        for (p, records) in &window {
            *ends.entry(*p).or_default() += records.len() as u64;
        }
        let next = Checkpoint {
            k: prev.k + 1,
            state: Some(state),
            ends: ends.clone(),
            prev: Some(Box::new(prev.clone())),
            part: None,
        };
        // Each batch's checkpoint names its partition's count and hash so
        // far; the rest is the window's (the last batch of a partition) or
        // the one before (the others).
        let with_part = |c: &Checkpoint, count: usize, hash: u64| {
            let c = Checkpoint { part: Some(Part { count: count as u64, hash }), ..c.clone() };
            serde_json::to_vec(&c).expect("a checkpoint serializes")
        };
        let closing_len = with_part(&next, 0, 0).len() as u64;
        if closing_len + 256 > self.settings.batch_bytes {
            let why = format!(
                "the Singer tap's state is {closing_len} bytes, too large for a commit group: raise \
                 --wal-bytes-per-file (a commit group is an eighth of it, at most 1 MiB), or make the tap's \
                 state smaller"
            );
            self.refused = Some(why.clone());
            warn!("{why}");
            return Err(PluginError(why));
        }
        let budget = self.settings.batch_bytes - closing_len - 64;
        let mut batches = Vec::new();
        for (p, records) in window {
            self.check_resent(p, &records);
            let stream = self.stream_name(p);
            let mut schema = self.schemas.remove(&p);
            let position = self.next.entry(p).or_default();
            let total = records.len();
            let mut start = 0;
            while start < total {
                let mut end = start;
                let mut bytes = 0u64;
                while end < total && (end == start || bytes + 12 + records[end].len() as u64 <= budget) {
                    bytes += 12 + records[end].len() as u64;
                    end += 1;
                }
                let hash = hash_records(&records[..end]);
                let base = if end == total { &next } else { &prev };
                let chunk = records[start..end]
                    .iter()
                    .enumerate()
                    .map(|(i, r)| Record { position: Position(*position + i as u64), bytes: r.clone() })
                    .collect();
                *position += (end - start) as u64;
                batches.push(Batch {
                    partition: p,
                    stream: stream.clone(),
                    records: chunk,
                    end: Position(*position),
                    checkpoint: Some(with_part(base, end, hash)),
                    schema: schema.take(),
                    window: skippr_core::Window::None,
                    keys: Vec::new(),
                });
                start = end;
            }
        }
        self.latest = next;
        Ok(batches)
    }

    /// After a resume from a state some of whose later records of `p` are
    /// committed: the tap's first records of `p` are those again (same
    /// count and hash), and keep their positions, so the host drops them as
    /// already held; or they are not, and they go after what is committed
    /// (nothing lost; a sink that does not upsert keeps both copies).
    fn check_resent(&mut self, p: u32, records: &[Vec<u8>]) {
        let Some((part, committed)) = self.verify.remove(&p) else { return };
        let n = part.count as usize;
        if records.len() >= n && hash_records(&records[..n]) == part.hash {
            info!(partition = p, records = n, "singer source: the tap re-sent the split window's committed records faithfully; they are not taken twice");
            return;
        }
        warn!(
            partition = p,
            records = n,
            "singer source: the tap did not re-send the split window's committed records as they were; they stay, \
             and what it sent now goes after them (a sink that does not upsert by key holds both)"
        );
        self.next.insert(p, committed);
    }
}

impl Source for SingerSource {
    fn streams(&self) -> Vec<String> {
        self.streams.iter().map(|s| s.name.clone()).collect()
    }

    fn open(&mut self, resume: &[ResumePoint]) -> Result<(), PluginError> {
        self.stop_run();
        self.drop_window();
        self.schemas.clear();
        self.exhausted = false;
        self.refused = None;
        self.verify.clear();
        self.next_run = None;
        let resumed = resume_from(resume)?;
        self.next = resumed.at;
        self.verify = resumed.verify;
        info!(
            window = resumed.from.k,
            partitions = self.next.len(),
            "singer source: resuming from the committed state"
        );
        // Window numbers only grow: a resume from the window before a split
        // one must not number its next window like one already committed.
        self.latest = Checkpoint { k: resumed.newest_k, ..resumed.from };
        Ok(())
    }

    fn read(&mut self, _records_max: u32) -> Result<(Vec<Batch>, bool), PluginError> {
        if self.exhausted {
            return Ok((Vec::new(), true));
        }
        if self.run.is_none() {
            if self.next_run.is_some_and(|t| Instant::now() < t) {
                return Ok((Vec::new(), false));
            }
            self.launch()?;
        }
        let deadline = Instant::now() + Duration::from_millis(200);
        loop {
            let run = self.run.as_mut().expect("launched above");
            let wait = deadline.saturating_duration_since(Instant::now());
            match run.lines.recv_timeout(wait) {
                Ok(Line::Text(line)) => {
                    run.last_line = Instant::now();
                    if line.trim().is_empty() {
                        continue;
                    }
                    // A STATE that closed an empty window brings nothing:
                    // read on.
                    if let Some(batches) = self.take_line(&line)?.filter(|b| !b.is_empty()) {
                        return Ok((batches, false));
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
                    if !clean {
                        let dropped = self.drop_window();
                        let e = PluginError(format!(
                            "singer tap {status}; {dropped} records after its last STATE are dropped and come again \
                             from that state"
                        ));
                        warn!("{e}");
                        return Err(e);
                    }
                    let dropped = self.drop_window();
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
                    return Ok((Vec::new(), false));
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
    /// The state to start the tap from: the newest checkpoint, or the one
    /// before it when some partition has not committed the newest window.
    from: Checkpoint,
    /// The next position of every partition, at that state.
    at: BTreeMap<u32, u64>,
    /// Partitions with records committed past that state: see
    /// `SingerSource::verify`.
    verify: BTreeMap<u32, (Part, u64)>,
    /// The highest window number committed.
    newest_k: u64,
}

fn resume_from(resume: &[ResumePoint]) -> Result<Resumed, PluginError> {
    let mut newest: Option<Checkpoint> = None;
    let mut parts: BTreeMap<u32, Option<Part>> = BTreeMap::new();
    for r in resume {
        let Some(bytes) = &r.checkpoint else { continue };
        let c: Checkpoint = serde_json::from_slice(bytes).map_err(|e| {
            PluginError(format!(
                "partition {}'s checkpoint is not a Singer source's ({e}); was this WAL written by another source?",
                r.partition
            ))
        })?;
        parts.insert(r.partition, c.part);
        if newest.as_ref().is_none_or(|n| c.k > n.k) {
            newest = Some(c);
        }
    }
    let committed: BTreeMap<u32, u64> = resume.iter().map(|r| (r.partition, r.position.0)).collect();
    let Some(newest) = newest else {
        if let Some(r) = resume.iter().find(|r| r.position.0 > 0) {
            return Err(PluginError(format!(
                "partition {} holds records but no Singer checkpoint; was this WAL written by another source?",
                r.partition
            )));
        }
        let none = BTreeMap::new();
        return Ok(Resumed { from: Checkpoint::none(), at: none.clone(), verify: BTreeMap::new(), newest_k: 0 });
    };
    let newest_k = newest.k;
    let whole = newest.ends.iter().all(|(p, end)| committed.get(p).copied().unwrap_or(0) >= *end);
    let mut from = if whole {
        newest
    } else {
        let prev = newest.prev.map(|p| *p).unwrap_or_else(Checkpoint::none);
        warn!(
            window = prev.k + 1,
            "singer source: a crash split the last window's commit; the tap resumes from the state before it, and \
             what it sends again of that window is checked against what was committed"
        );
        prev
    };
    from.prev = None;
    from.part = None;
    let at = from.ends.clone();
    let mut verify = BTreeMap::new();
    for (p, committed) in &committed {
        let start = at.get(p).copied().unwrap_or(0);
        if *committed <= start {
            continue;
        }
        // Records committed past the state: the last batch's part says how
        // many and their hash; a part that does not add up is checked as a
        // mismatch (they stay, and what comes again goes after them).
        let part = parts.get(p).copied().flatten().filter(|part| part.count == committed - start);
        let part = part.unwrap_or(Part { count: u64::MAX, hash: 0 });
        verify.insert(*p, (part, *committed));
    }
    Ok(Resumed { from, at, verify, newest_k })
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
        let name: String =
            tap_name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        skippr_core::rules::check_stream_name(&name)
            .map_err(|why| bad(format!("selects the stream {:?}, refused: {why}", super::process::clip(&tap_name))))?;
        streams.push(SingerStream { tap_name, name, key_properties: keys });
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

    fn point(partition: u32, position: u64, c: Option<&Checkpoint>) -> ResumePoint {
        ResumePoint { partition, position: Position(position), checkpoint: c.map(|c| serde_json::to_vec(c).unwrap()) }
    }

    fn checkpoint(k: u64, ends: &[(u32, u64)], prev: Option<Checkpoint>) -> Checkpoint {
        Checkpoint {
            k,
            state: Some(serde_json::json!({ "k": k })),
            ends: ends.iter().copied().collect(),
            prev: prev.map(Box::new),
            part: None,
        }
    }

    #[test]
    fn a_whole_window_resumes_from_its_state_and_a_split_one_from_the_state_before() {
        let c1 = checkpoint(1, &[(1, 10), (2, 5)], None);
        let c2 = checkpoint(2, &[(1, 20), (2, 9)], Some(c1.clone()));
        let at = |v: &[(u32, u64)]| v.iter().copied().collect::<BTreeMap<u32, u64>>();
        // Both partitions committed window 2.
        let r = resume_from(&[point(1, 20, Some(&c2)), point(2, 9, Some(&c2))]).unwrap();
        assert_eq!((r.from.k, r.at, r.verify.len(), r.newest_k), (2, at(&[(1, 20), (2, 9)]), 0, 2));
        // Partition 2's batch of window 2 did not commit: resume from 1, and
        // check what the tap sends again of partition 1 against the ten
        // records it committed past state 1.
        let part = Part { count: 10, hash: 77 };
        let c2_of_1 = Checkpoint { part: Some(part), ..c2.clone() };
        let r = resume_from(&[point(1, 20, Some(&c2_of_1)), point(2, 5, Some(&c1))]).unwrap();
        assert_eq!((r.from.k, r.from.state, r.at), (1, Some(serde_json::json!({"k": 1})), at(&[(1, 10), (2, 5)])));
        assert_eq!((r.verify.get(&1), r.verify.get(&2), r.newest_k), (Some(&(part, 20)), None, 2));
        // Partition 1 committed only a first part of window 2 (its earlier
        // batch carries window 1's checkpoint and the part so far); a part
        // that does not add up is a mismatch.
        let c1_part = Checkpoint { part: Some(Part { count: 4, hash: 5 }), ..c1.clone() };
        let r = resume_from(&[point(1, 14, Some(&c1_part)), point(2, 5, Some(&c1))]).unwrap();
        assert_eq!((r.from.k, r.verify.get(&1)), (1, Some(&(Part { count: 4, hash: 5 }, 14))));
        let r = resume_from(&[point(1, 15, Some(&c1_part)), point(2, 5, Some(&c1))]).unwrap();
        assert_eq!(r.verify.get(&1).map(|v| v.0.count), Some(u64::MAX));
        // Nothing yet.
        let r = resume_from(&[]).unwrap();
        assert_eq!((r.from.k, r.from.state, r.at.len()), (0, None, 0));
        // Records without a Singer checkpoint: another source's WAL.
        assert!(resume_from(&[point(1, 3, None)]).err().unwrap().0.contains("another source"));
    }

    #[test]
    fn records_sent_again_keep_their_positions_only_when_they_are_the_ones_committed() {
        let a = super::super::FileSource::partition_of("a");
        let line = |i: u32| format!(r#"{{"type":"RECORD","stream":"a","record":{{"id":{i}}}}}"#);
        let bytes = |i: u32| format!(r#"{{"id":{i}}}"#).into_bytes();
        for (first, faithful) in [(0, true), (1, false)] {
            let mut s = source(1 << 16);
            s.next.insert(a, 10);
            // Records 0 and 1 were committed at 10 and 11 past the state.
            let part = Part { count: 2, hash: hash_records(&[bytes(0), bytes(1)]) };
            s.verify.insert(a, (part, 12));
            for i in first..3 {
                s.take_line(&line(i)).unwrap();
            }
            let batches = s.take_line(r#"{"type":"STATE","value":{}}"#).unwrap().unwrap();
            let positions: Vec<u64> = batches[0].records.iter().map(|r| r.position.0).collect();
            if faithful {
                assert_eq!(positions, vec![10, 11, 12], "the host drops 10 and 11 as held");
            } else {
                assert_eq!(positions, vec![12, 13], "nothing is dropped: it goes after what is committed");
            }
            assert!(s.verify.is_empty());
        }
    }

    fn settings(batch_bytes: u64) -> SingerSettings {
        SingerSettings {
            command: "true".into(),
            catalog: None,
            properties: None,
            interval: None,
            buffer_bytes: 1 << 20,
            timeout: Duration::from_secs(5),
            batch_bytes,
            record_bytes_max: 4 << 20,
        }
    }

    fn source(batch_bytes: u64) -> SingerSource {
        let catalog = r#"{"streams":[{"tap_stream_id":"a","key_properties":["id"]},{"tap_stream_id":"b.c"}]}"#;
        SingerSource::with_streams(settings(batch_bytes), parse_catalog(catalog).unwrap()).unwrap()
    }

    #[test]
    fn records_wait_for_the_state_that_closes_their_window_and_batches_stay_small() {
        let mut s = source(600);
        let a = super::super::FileSource::partition_of("a");
        for i in 0..10 {
            let line = format!(r#"{{"type":"RECORD","stream":"a","record":{{"id":{i},"pad":"{}"}}}}"#, "x".repeat(40));
            assert!(s.take_line(&line).unwrap().is_none());
        }
        assert!(s
            .take_line(r#"{"type":"SCHEMA","stream":"b.c","schema":{"type":"object"},"key_properties":[]}"#)
            .unwrap()
            .is_none());
        assert!(s.take_line(r#"{"type":"RECORD","stream":"b.c","record":{"v":1}}"#).unwrap().is_none());
        let batches = s.take_line(r#"{"type":"STATE","value":{"bookmarks":{"a":1}}}"#).unwrap().unwrap();
        let of_a: Vec<&Batch> = batches.iter().filter(|b| b.partition == a).collect();
        assert!(of_a.len() > 1, "ten 60-byte records cut at 600 bytes less the checkpoint");
        let positions: Vec<u64> = of_a.iter().flat_map(|b| b.records.iter().map(|r| r.position.0)).collect();
        assert_eq!(positions, (0..10).collect::<Vec<_>>());
        let last: Checkpoint = serde_json::from_slice(of_a.last().unwrap().checkpoint.as_ref().unwrap()).unwrap();
        let first: Checkpoint = serde_json::from_slice(of_a[0].checkpoint.as_ref().unwrap()).unwrap();
        assert_eq!((first.k, last.k), (0, 1), "earlier batches name the state before");
        assert_eq!(last.state, Some(serde_json::json!({"bookmarks":{"a":1}})));
        let bc = batches.iter().find(|b| b.stream == "b_c").expect("the stream's name made safe");
        assert_eq!(bc.schema.as_deref(), Some(&br#"{"type":"object"}"#[..]));
        assert_eq!(&bc.records[0].bytes[..], br#"{"v":1}"#);
        // The next window counts on.
        s.take_line(r#"{"type":"RECORD","stream":"a","record":{"id":10}}"#).unwrap();
        let batches = s.take_line(r#"{"type":"STATE","value":{"bookmarks":{"a":2}}}"#).unwrap().unwrap();
        assert_eq!((batches.len(), batches[0].records[0].position.0, batches[0].end.0), (1, 10, 11));
    }

    #[test]
    fn garbage_an_unselected_stream_and_a_window_past_the_buffer_fail_the_read() {
        let mut s = source(1 << 16);
        assert!(s.take_line("this is not json").unwrap_err().0.contains("not a Singer message"));
        assert!(s
            .take_line(r#"{"type":"RECORD","stream":"zzz","record":{}}"#)
            .unwrap_err()
            .0
            .contains("does not select"));
        s.settings.buffer_bytes = 100;
        s.take_line(r#"{"type":"RECORD","stream":"a","record":{"id":1}}"#).unwrap();
        let e = s
            .take_line(&format!(r#"{{"type":"RECORD","stream":"a","record":{{"p":"{}"}}}}"#, "x".repeat(100)))
            .unwrap_err();
        assert!(e.0.contains("--singer-buffer-bytes"), "{e}");
        assert!(s.window.is_empty(), "the open window is dropped");
        assert!(s.refused().is_some_and(|why| why.contains("--singer-buffer-bytes")), "the engine is told to stop");
    }

    #[test]
    fn catalogs_select_streams_and_name_their_keys() {
        let c = r#"{"streams":[
            {"tap_stream_id":"users","stream":"users","key_properties":["id"],
             "metadata":[{"breadcrumb":[],"metadata":{"selected":true}}]},
            {"tap_stream_id":"orders","metadata":[{"breadcrumb":[],"metadata":{"selected":false,"table-key-properties":["o"]}}]},
            {"tap_stream_id":"public-items","metadata":[{"breadcrumb":[],"metadata":{"selected":true,"table-key-properties":["a","b"]}}]}]}"#;
        let s = parse_catalog(c).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].key_properties, vec!["id".to_string()]);
        assert_eq!((s[1].name.as_str(), s[1].key_properties.len()), ("public-items", 2));
        assert!(parse_catalog(r#"{"streams":[]}"#).unwrap_err().0.contains("selects no stream"));
        assert!(parse_catalog("nope").unwrap_err().0.contains("not JSON"));
    }
}
