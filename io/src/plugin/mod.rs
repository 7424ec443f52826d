//! Sources, sinks and schema plugins as the driver sees them (the traits),
//! and every implementation. Each built-in plugin is a folder: its logic and
//! I/O in `mod.rs`, its settings in `settings.rs` (flags and file keys,
//! declared once, with their defaults and checks): the `generator`, `file`
//! and `singer` sources, the `dir`, `s3` and `postgres` sinks, and external
//! plugins run as child processes over the runtime protocol (`process`,
//! started by `spawner`), and `replay`, dead letters sent back as a
//! source of their own. `registry` lists the kinds and resolves the one a
//! run asks for; `stdout` has no settings.
//!
//! The traits are blocking; the driver runs each call on a blocking thread.
//! The engine issues at most one read per source at a time.

use skippr_core::format::Record;
use skippr_core::{CompactionId, Position, Records, ResumePoint, SinkOutcome};

pub mod dir_sink;
pub mod file_source;
pub mod generator;
pub mod lines;
pub mod postgres_sink;
pub mod process;
pub mod registry;
pub mod replay;
pub mod s3_sink;
pub mod singer;
pub(crate) mod spawner;
pub mod stdout;

pub use dir_sink::DirSink;
pub use file_source::FileSource;
pub use generator::Generator;
pub use process::{ExternalSchema, ExternalSink, ExternalSource};
pub use singer::SingerSource;
pub use stdout::StdoutSink;

/// The longest duration any setting takes: a year, in seconds. Longer ones
/// are refused (they would overflow the clock's arithmetic).
pub const SECONDS_MAX: f64 = 365.0 * 24.0 * 3600.0;

/// A source or sink failed in a way that a retry may fix.
#[derive(Debug)]
pub struct PluginError(pub String);

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Records of one partition, with the stream they belong to by name.
#[derive(Debug)]
pub struct Batch {
    pub partition: u32,
    pub stream: String,
    pub records: Vec<Record>,
    pub end: Position,
    pub checkpoint: Option<Vec<u8>>,
    /// The stream's schema (JSON), when the source sends one.
    pub schema: Option<Vec<u8>>,
    /// How the batch stands to the source's window (Singer taps: section
    /// 22 of docs/ARCHITECTURE.md); `Window::None` for every other source.
    pub window: skippr_core::Window,
    /// Windowed batches: each record's resume key, or nothing.
    pub keys: Vec<Option<u64>>,
}

pub trait Source: Send {
    /// The streams this source may emit, known before it starts.
    fn streams(&self) -> Vec<String>;
    /// Starts (or restarts) at the host's positions: a read-only snapshot.
    fn open(&mut self, resume: &[ResumePoint]) -> Result<(), PluginError>;
    /// Before `open`: input an operator gave up, per partition `(at,
    /// next)`. The engine drops the records in it; a source that refuses
    /// input before it becomes a record (a line too long to read) passes
    /// over it instead.
    fn pass_over(&mut self, skips: &[(u32, Position, Position)]) {
        let _ = skips;
    }
    /// Up to `records_max` records, promptly; `true` when a finite source
    /// has nothing more, ever.
    fn read(&mut self, records_max: u32) -> Result<(Vec<Batch>, bool), PluginError>;
    /// Everything below these positions is committed.
    fn ack(&mut self, acks: &[(u32, Position)]) -> Result<(), PluginError>;
    /// After a failed read: why the source cannot go on until an operator
    /// changes something (the engine then stops instead of retrying).
    fn refused(&self) -> Option<String> {
        None
    }
    /// Where a record of `partition` at `position` is, for a message (a
    /// file source names the file and byte offset).
    fn describe(&self, partition: u32, position: Position) -> String {
        format!("stream partition {partition}, position {}", position.0)
    }
}

/// Decides whether a stream may move to a new schema.
pub trait SchemaPlugin: Send {
    /// `Ok(None)` accepts; `Ok(Some(reason))` refuses.
    fn decide(&mut self, stream: &str, fingerprint: u64, schema: &[u8]) -> Result<Option<String>, PluginError>;
}

/// A batch as the file-like sinks store it: each record's bytes as
/// emitted, each followed by a newline.
pub fn json_lines(records: &Records) -> Vec<u8> {
    let mut body = Vec::with_capacity(records.iter().map(|r| r.len() + 1).sum());
    for r in records {
        body.extend_from_slice(r);
        body.push(b'\n');
    }
    body
}

pub trait Sink: Send {
    fn apply(
        &mut self,
        stream: &str,
        seq: u64,
        id: CompactionId,
        records: &Records,
    ) -> Result<SinkOutcome, PluginError>;

    /// The highest sequence number applied per stream of `streams`, where
    /// the sink can tell (asked once, at recovery). The default cannot.
    fn progress(&mut self, _streams: &[String]) -> Result<Vec<(String, u64)>, PluginError> {
        Ok(Vec::new())
    }
}
