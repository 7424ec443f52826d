//! Sources and sinks as the driver sees them, and the built-in ones: the
//! `generator` source, the `dir` sink and the `stdout` sink.
//!
//! The traits are blocking; the driver runs each call on a blocking thread.
//! The engine issues at most one read per source at a time.

use skippr_core::wal::Record;
use skippr_core::{CompactionId, Position, ResumePoint, SinkOutcome};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub use crate::file_source::FileSource;

/// A source or sink failed in a way that a retry may fix.
#[derive(Debug)]
pub struct PluginError(pub String);

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Records of one partition, with the stream they belong to by name.
pub struct Batch {
    pub partition: u32,
    pub stream: String,
    pub records: Vec<Record>,
    pub end: Position,
    pub checkpoint: Option<Vec<u8>>,
    /// The stream's schema (JSON), when the source sends one.
    pub schema: Option<Vec<u8>>,
}

pub trait Source: Send {
    /// The streams this source may emit, known before it starts.
    fn streams(&self) -> Vec<String>;
    /// Starts (or restarts) at the host's positions: a read-only snapshot.
    fn open(&mut self, resume: &[ResumePoint]) -> Result<(), PluginError>;
    /// Up to `records_max` records, promptly; `true` when a finite source
    /// has nothing more, ever.
    fn read(&mut self, records_max: u32) -> Result<(Vec<Batch>, bool), PluginError>;
    /// Everything below these positions is committed.
    fn ack(&mut self, acks: &[(u32, Position)]) -> Result<(), PluginError>;
}

/// Decides whether a stream may move to a new schema.
pub trait SchemaPlugin: Send {
    /// `Ok(None)` accepts; `Ok(Some(reason))` refuses.
    fn decide(&mut self, stream: &str, fingerprint: u64, schema: &[u8]) -> Result<Option<String>, PluginError>;
}

pub trait Sink: Send {
    fn apply(
        &mut self,
        stream: &str,
        seq: u64,
        id: CompactionId,
        records: &[Vec<u8>],
    ) -> Result<SinkOutcome, PluginError>;

    /// The highest sequence number applied per stream of `streams`, where
    /// the sink can tell (asked once, at recovery). The default cannot.
    fn progress(&mut self, _streams: &[String]) -> Result<Vec<(String, u64)>, PluginError> {
        Ok(Vec::new())
    }
}

/// The built-in generator: `partitions` partitions per stream, each a run of
/// JSON records `{"stream","partition","seq","value"}` with `seq` from 0 and
/// no gaps. Finite with `records` per partition, endless with 0. It can replay
/// from any position, so it needs no acks. Partition `p` of stream `s` is the
/// source partition `s * partitions + p`.
pub struct Generator {
    streams: Vec<String>,
    partitions: u32,
    records: u64,
    seed: u64,
    next: Vec<u64>,
    turn: usize,
    /// Records per second over all partitions; 0 for as fast as asked.
    rate: u64,
    /// Since `open`: when, and how many records were produced.
    opened: std::time::Instant,
    produced: u64,
}

impl Generator {
    pub fn new(streams: Vec<String>, partitions: u32, records: u64, seed: u64) -> Generator {
        let n = streams.len() * partitions as usize;
        let opened = std::time::Instant::now();
        Generator { streams, partitions, records, seed, next: vec![0; n], turn: 0, rate: 0, opened, produced: 0 }
    }

    /// Produces at most `rate` records per second (0: no limit).
    pub fn with_rate(mut self, rate: u64) -> Generator {
        self.rate = rate;
        self
    }

    /// The record at `seq` of a partition: a pure function of seed and place.
    pub fn record(&self, stream: &str, partition: u32, seq: u64) -> Vec<u8> {
        let mut x = self.seed ^ (partition as u64) << 40 ^ seq.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for b in stream.bytes() {
            x = (x ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        format!(r#"{{"stream":"{stream}","partition":{partition},"seq":{seq},"value":"{x:016x}"}}"#).into_bytes()
    }

    fn place(&self, i: usize) -> (&str, u32) {
        (&self.streams[i / self.partitions as usize], i as u32 % self.partitions)
    }
}

impl Source for Generator {
    fn streams(&self) -> Vec<String> {
        self.streams.clone()
    }

    fn open(&mut self, resume: &[ResumePoint]) -> Result<(), PluginError> {
        self.opened = std::time::Instant::now();
        self.produced = 0;
        self.next.iter_mut().for_each(|n| *n = 0);
        for r in resume {
            if let Some(n) = self.next.get_mut(r.partition as usize) {
                *n = r.position.0;
            }
        }
        Ok(())
    }

    fn read(&mut self, records_max: u32) -> Result<(Vec<Batch>, bool), PluginError> {
        let mut batches = Vec::new();
        let mut budget = records_max as u64;
        if self.rate > 0 {
            let allowed = (self.opened.elapsed().as_secs_f64() * self.rate as f64) as u64;
            budget = budget.min(allowed.saturating_sub(self.produced));
        }
        let n = self.next.len();
        for k in 0..n {
            let i = (self.turn + k) % n;
            let from = self.next[i];
            let to = if self.records == 0 { from + budget } else { self.records.min(from + budget) };
            if to <= from || budget == 0 {
                continue;
            }
            let (stream, partition) = self.place(i);
            let records = (from..to)
                .map(|seq| Record { position: Position(seq), bytes: self.record(stream, partition, seq) })
                .collect();
            batches.push(Batch {
                partition: i as u32,
                stream: stream.to_string(),
                records,
                end: Position(to),
                checkpoint: None,
                schema: None,
            });
            budget -= to - from;
            self.produced += to - from;
            self.next[i] = to;
        }
        self.turn = (self.turn + 1) % n.max(1);
        let exhausted = self.records != 0 && self.next.iter().all(|&n| n >= self.records);
        Ok((batches, exhausted))
    }

    fn ack(&mut self, _acks: &[(u32, Position)]) -> Result<(), PluginError> {
        Ok(())
    }
}

/// The built-in directory sink: each destination batch becomes
/// `<dir>/<stream>/<seq, 20 digits>-<compaction_id>.jsonl`, one record per
/// line as emitted, written to a temporary file, fsynced, renamed into place
/// and the directory fsynced. A replay of an existing id with identical bytes
/// is `already_applied`; different bytes, or another id under the same
/// number, is `fatal`.
pub struct DirSink {
    dir: PathBuf,
    /// Per stream, the ids already in place by sequence number.
    seen: BTreeMap<String, BTreeMap<u64, CompactionId>>,
}

impl DirSink {
    pub fn open(dir: &Path) -> Result<DirSink, PluginError> {
        std::fs::create_dir_all(dir).map_err(|e| PluginError(format!("cannot create {}: {e}", dir.display())))?;
        Ok(DirSink { dir: dir.to_path_buf(), seen: BTreeMap::new() })
    }

    fn load(&mut self, stream: &str) -> Result<&mut BTreeMap<u64, CompactionId>, PluginError> {
        if !self.seen.contains_key(stream) {
            let dir = self.dir.join(stream);
            let mut seen = BTreeMap::new();
            if dir.exists() {
                let entries = std::fs::read_dir(&dir).map_err(|e| PluginError(format!("{}: {e}", dir.display())))?;
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if let Some((seq, id)) = parse_name(&name) {
                        seen.insert(seq, id);
                    }
                }
            }
            self.seen.insert(stream.to_string(), seen);
        }
        Ok(self.seen.get_mut(stream).expect("inserted above"))
    }
}

fn file_name(seq: u64, id: CompactionId) -> String {
    format!("{seq:020}-{id}.jsonl")
}

fn parse_name(name: &str) -> Option<(u64, CompactionId)> {
    let stem = name.strip_suffix(".jsonl")?;
    let (seq, id) = stem.split_once('-')?;
    Some((seq.parse().ok()?, CompactionId(u64::from_str_radix(id, 16).ok()?)))
}

impl Sink for DirSink {
    fn progress(&mut self, streams: &[String]) -> Result<Vec<(String, u64)>, PluginError> {
        let mut out = Vec::new();
        for stream in streams {
            if let Some((&seq, _)) = self.load(stream)?.last_key_value() {
                out.push((stream.clone(), seq));
            }
        }
        Ok(out)
    }

    fn apply(
        &mut self,
        stream: &str,
        seq: u64,
        id: CompactionId,
        records: &[Vec<u8>],
    ) -> Result<SinkOutcome, PluginError> {
        let mut body = Vec::with_capacity(records.iter().map(|r| r.len() + 1).sum());
        for r in records {
            body.extend_from_slice(r);
            body.push(b'\n');
        }
        let dir = self.dir.join(stream);
        let path = dir.join(file_name(seq, id));
        let err = |what: &str, e: std::io::Error| PluginError(format!("{what} {}: {e}", path.display()));
        match self.load(stream)?.get(&seq) {
            Some(existing) if *existing == id => {
                let on_disk = std::fs::read(&path).map_err(|e| err("cannot read", e))?;
                return Ok(if on_disk == body { SinkOutcome::AlreadyApplied } else { SinkOutcome::Fatal });
            }
            Some(_) => return Ok(SinkOutcome::Fatal),
            None => {}
        }
        std::fs::create_dir_all(&dir).map_err(|e| err("cannot create the directory of", e))?;
        let tmp = dir.join(format!(".tmp-{}", file_name(seq, id)));
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)
            .map_err(|e| err("cannot write", e))?;
        f.write_all(&body).and_then(|_| f.sync_all()).map_err(|e| err("cannot write", e))?;
        std::fs::rename(&tmp, &path).map_err(|e| err("cannot rename into", e))?;
        File::open(&dir).and_then(|d| d.sync_all()).map_err(|e| err("cannot sync the directory of", e))?;
        self.load(stream)?.insert(seq, id);
        Ok(SinkOutcome::Applied)
    }
}

/// The built-in stdout sink: prints each record on its own line. It cannot
/// tell a replay from a new batch, so after a crash it may print a batch
/// twice: use it for looking, not for exactly-once delivery.
pub struct StdoutSink;

impl Sink for StdoutSink {
    fn apply(&mut self, _: &str, _: u64, _: CompactionId, records: &[Vec<u8>]) -> Result<SinkOutcome, PluginError> {
        let mut out = std::io::stdout().lock();
        for r in records {
            out.write_all(r).and_then(|_| out.write_all(b"\n")).map_err(|e| PluginError(format!("stdout: {e}")))?;
        }
        out.flush().map_err(|e| PluginError(format!("stdout: {e}")))?;
        Ok(SinkOutcome::Applied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_finite_gapless_and_resumes() {
        let mut g = Generator::new(vec!["a".into(), "b".into()], 2, 5, 7);
        let mut got: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        loop {
            let (batches, done) = g.read(3).unwrap();
            for b in batches {
                got.entry(b.partition).or_default().extend(b.records.iter().map(|r| r.position.0));
            }
            if done {
                break;
            }
        }
        assert_eq!(got.len(), 4);
        assert!(got.values().all(|seqs| *seqs == vec![0, 1, 2, 3, 4]));
        let rec = String::from_utf8(g.record("b", 1, 4)).unwrap();
        assert!(rec.starts_with(r#"{"stream":"b","partition":1,"seq":4,"value":""#), "{rec}");
        g.open(&[ResumePoint { partition: 3, position: Position(4), checkpoint: None }]).unwrap();
        let (batches, _) = g.read(100).unwrap();
        let p3: Vec<_> = batches.iter().filter(|b| b.partition == 3).flat_map(|b| &b.records).collect();
        assert_eq!(p3.len(), 1);
        assert_eq!(p3[0].bytes, g.record("b", 1, 4));
    }

    #[test]
    fn the_dir_sink_is_idempotent_and_refuses_different_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let mut sink = DirSink::open(tmp.path()).unwrap();
        let recs = vec![b"{\"a\":1}".to_vec(), b"{\"a\":2}".to_vec()];
        assert_eq!(sink.apply("s", 0, CompactionId(9), &recs).unwrap(), SinkOutcome::Applied);
        assert_eq!(sink.apply("s", 0, CompactionId(9), &recs).unwrap(), SinkOutcome::AlreadyApplied);
        let path = tmp.path().join("s").join("00000000000000000000-0000000000000009.jsonl");
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":1}\n{\"a\":2}\n");
        // A new process sees what is on disk.
        let mut again = DirSink::open(tmp.path()).unwrap();
        assert_eq!(again.apply("s", 0, CompactionId(9), &recs).unwrap(), SinkOutcome::AlreadyApplied);
        assert_eq!(again.apply("s", 0, CompactionId(9), &recs[..1]).unwrap(), SinkOutcome::Fatal);
        assert_eq!(again.apply("s", 0, CompactionId(8), &recs).unwrap(), SinkOutcome::Fatal);
        assert_eq!(again.apply("s", 1, CompactionId(8), &recs).unwrap(), SinkOutcome::Applied);
    }
}
