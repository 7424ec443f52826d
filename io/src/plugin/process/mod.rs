//! External plugins: child processes speaking the runtime protocol, version
//! 2 or 1 (docs/PROTOCOL.md), as JSON lines on stdin and stdout, logs on
//! stderr. Version 2 lets a sink refuse records of a batch (`refused`) and
//! requires a result's echoes.
//!
//! A plugin that exits, hangs past its timeout, or breaks the protocol is
//! killed with every process it started; the request fails with an error
//! that names the plugin (and the line), and the engine retries with
//! backoff. Breaking the protocol means: a line that is not protocol JSON or
//! not UTF-8, a line longer than the role's bound, a line sent while no
//! request was in flight (a second answer, or one nobody asked for), a reply
//! of another type than the request asks, a `result` whose echoed `seq`
//! or `compaction_id` is not the request's (or, in version 2, is missing),
//! or a refusal that does not name records of the batch in order. The next request starts the
//! plugin again and re-opens it from host-provided state: the positions the
//! host acked, never anything the plugin kept itself.
//!
//! Messages are built by a JSON encoder, never spliced: a record is embedded
//! verbatim as a JSON value, which is safe because every record was checked
//! at intake to be exactly one JSON value without a line break
//! (`skippr_core::admit`), and is checked again here.

pub mod settings;

use super::lines::{log_stderr, stdout_lines, Line, Lines};
use super::{Batch, PluginError, SchemaPlugin, Sink, Source};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use skippr_core::format::Record;
use skippr_core::{CompactionId, Position, Records, RefusedIndex, ResumePoint, SinkOutcome};
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use tracing::{info, warn};

/// The protocol this host speaks; a plugin may answer this or any version
/// down to `PROTOCOL_OLDEST` (docs/PROTOCOL.md).
pub const PROTOCOL_VERSION: u32 = 2;
pub const PROTOCOL_OLDEST: u32 = 1;

/// The longest line a sink or schema plugin may send.
const REPLY_LINE_BYTES_MAX: usize = 1 << 20;
/// The longest line a source plugin may send, at least: one batch reply
/// may hold several records of the largest size.
const SOURCE_LINE_BYTES_MIN: usize = 64 << 20;

/// The longest line a source plugin may send when records may be up to
/// `record_bytes_max` bytes: told to it in every `read` request.
pub fn source_line_bytes_max(record_bytes_max: u64) -> usize {
    SOURCE_LINE_BYTES_MIN.max(2 * record_bytes_max as usize + (1 << 20))
}

/// One plugin process and its line channel.
struct Process {
    name: String,
    command: String,
    role: &'static str,
    timeout: Duration,
    line_bytes_max: usize,
    running: Option<Running>,
    /// A line longer than the bound: a restarted plugin would send it
    /// again, so a source stops the daemon instead of retrying.
    too_long: Option<String>,
}

struct Running {
    child: Child,
    stdin: ChildStdin,
    lines: Lines,
    /// The protocol version the plugin answered its hello with.
    speaks: u32,
}

#[derive(Deserialize)]
struct Tag {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct HelloReply {
    protocol: u32,
    #[serde(default)]
    streams: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct WireResume {
    partition: u32,
    position: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    checkpoint: Option<String>,
}

#[derive(Deserialize)]
struct BatchReply {
    batches: Vec<WireBatch>,
    #[serde(default)]
    exhausted: bool,
}

#[derive(Deserialize)]
struct WireBatch {
    partition: u32,
    stream: String,
    records: Vec<WireRecord>,
    end: u64,
    #[serde(default)]
    checkpoint: Option<String>,
    #[serde(default)]
    schema: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct DecisionReply {
    accept: bool,
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
struct WireRecord {
    position: u64,
    data: Box<RawValue>,
}

#[derive(Deserialize)]
struct ResultReply {
    outcome: String,
    /// Echoes of the request's, checked when present (required from
    /// version 2 on).
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    compaction_id: Option<String>,
    /// Version 2, with the outcome `refused`: the records refused.
    #[serde(default)]
    refused: Vec<WireRefused>,
}

#[derive(Deserialize)]
struct WireRefused {
    index: u32,
    #[serde(default)]
    reason: String,
}

/// A sink's `apply` request.
#[derive(Serialize)]
struct ApplyRequest<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    stream: &'a str,
    seq: u64,
    compaction_id: String,
    records: Vec<&'a RawValue>,
}

/// A schema plugin's `schema` request.
#[derive(Serialize)]
struct SchemaRequest<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    stream: &'a str,
    fingerprint: String,
    schema: &'a RawValue,
}

#[derive(Deserialize)]
struct ErrorReply {
    message: String,
}

impl Process {
    fn new(name: &str, command: &str, role: &'static str, timeout: Duration, line_bytes_max: usize) -> Process {
        Process {
            name: name.into(),
            command: command.into(),
            role,
            timeout,
            line_bytes_max,
            running: None,
            too_long: None,
        }
    }

    fn err(&self, what: impl std::fmt::Display) -> PluginError {
        PluginError(format!("plugin '{}': {what}", self.name))
    }

    /// Starts the process if it is not running and says hello; returns the
    /// streams a source declared.
    fn ensure(&mut self) -> Result<Option<Vec<String>>, PluginError> {
        if self.running.is_some() {
            return Ok(None);
        }
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(&self.command).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child =
            super::spawner::spawn(cmd).map_err(|e| self.err(format!("cannot start `{}`: {e}", self.command)))?;
        info!(plugin = %self.name, pid = child.id(), "plugin started");
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let lines = stdout_lines(stdout, self.line_bytes_max, self.line_bytes_max);
        log_stderr(stderr, self.name.clone());
        self.running = Some(Running { child, stdin, lines, speaks: PROTOCOL_OLDEST });
        // A process that does not complete its hello is not kept: the next
        // request starts a new one and says hello again.
        let hello = format!(r#"{{"type":"hello","protocol":{PROTOCOL_VERSION},"role":"{}"}}"#, self.role);
        let reply = self.request(&hello, "hello").and_then(|line| self.parse::<HelloReply>(&line));
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                self.stop();
                return Err(e);
            }
        };
        if !(PROTOCOL_OLDEST..=PROTOCOL_VERSION).contains(&reply.protocol) {
            self.stop();
            return Err(self.err(format!(
                "speaks protocol {}, this host speaks {PROTOCOL_OLDEST} to {PROTOCOL_VERSION}",
                reply.protocol
            )));
        }
        self.running.as_mut().expect("started").speaks = reply.protocol;
        Ok(Some(reply.streams))
    }

    /// Sends one line and waits for the reply of type `expect`. Exactly one
    /// line answers a request: one that arrived while no request was in
    /// flight is a protocol violation, found here before the next request
    /// goes out.
    fn request(&mut self, line: &str, expect: &str) -> Result<String, PluginError> {
        let timeout = self.timeout;
        let running = self.running.as_mut().expect("started");
        match running.lines.try_recv() {
            Err(mpsc::TryRecvError::Empty) => {}
            Ok(Line::End) | Err(mpsc::TryRecvError::Disconnected) => {
                let status = self.stop();
                return Err(self.err(format!("it {status}")));
            }
            Ok(stray) => {
                self.stop();
                return Err(self.err(format!(
                    "broke the protocol: it sent a line while no request was in flight (each request gets exactly \
                     one line); restarted: {}",
                    shown(&stray)
                )));
            }
        }
        if let Err(e) = writeln!(running.stdin, "{line}").and_then(|_| running.stdin.flush()) {
            let status = self.stop();
            return Err(self.err(format!("cannot write to it ({e}); it {status}")));
        }
        let reply = match running.lines.recv_timeout(timeout) {
            Ok(Line::Text(reply)) => reply,
            Ok(Line::End) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.stop();
                return Err(self.err(format!("it {status}")));
            }
            Ok(bad) => {
                self.stop();
                let why = self.err(format!("broke the protocol: {}; restarted", shown(&bad)));
                if let Line::TooLong { bytes_max } = bad {
                    self.too_long = Some(format!(
                        "{why}. Its lines may be at most {bytes_max} bytes (every `read` request says so in \
                         `bytes_max`): send fewer records per batch, or raise --record-bytes-max"
                    ));
                }
                return Err(why);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.stop();
                return Err(self.err(format!("no answer within {timeout:?}; killed, it restarts on the next request")));
            }
        };
        let tag: Tag = match serde_json::from_str(&reply) {
            Ok(t) => t,
            Err(e) => {
                self.stop();
                return Err(self.err(format!("sent a line that is not protocol JSON ({e}): {}", clip(&reply))));
            }
        };
        if tag.kind == "error" {
            let message = serde_json::from_str::<ErrorReply>(&reply).map_or(reply.clone(), |r| r.message);
            return Err(self.err(format!("reported an error: {message}")));
        }
        if tag.kind != expect {
            self.stop();
            return Err(self.err(format!("answered `{}` to a `{expect}` request: {}", tag.kind, clip(&reply))));
        }
        Ok(reply)
    }

    fn parse<'a, T: Deserialize<'a>>(&mut self, line: &'a str) -> Result<T, PluginError> {
        serde_json::from_str(line).map_err(|e| {
            self.stop();
            self.err(format!("sent a malformed message ({e}): {}", clip(line)))
        })
    }

    /// Kills the process and reaps it; says how it ended.
    fn stop(&mut self) -> String {
        let Some(mut r) = self.running.take() else { return "was not running".into() };
        // Its stdout may close a moment before it is reaped: give a process
        // that is exiting a moment to say how, before killing it.
        for _ in 0..20 {
            if !matches!(r.child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let status = match r.child.try_wait() {
            Ok(Some(status)) => format!("exited ({status})"),
            _ => {
                super::spawner::kill_tree(&mut r.child);
                "was killed".into()
            }
        };
        warn!(plugin = %self.name, "plugin stopped: {status}");
        status
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut r) = self.running.take() {
            super::spawner::kill_tree(&mut r.child);
        }
    }
}

/// A line the reader thread passed on, for a message.
fn shown(line: &Line) -> String {
    match line {
        Line::Text(text) => clip(text),
        Line::NotUtf8(lossy) => format!("a line that is not UTF-8: {lossy}"),
        Line::TooLong { bytes_max } => format!("a line longer than {bytes_max} bytes"),
        Line::End => "the end of its output".into(),
    }
}

/// A line cut to 200 bytes for a message, control characters escaped.
pub(crate) fn clip(s: &str) -> String {
    let cut = if s.len() > 200 {
        format!("{}...", &s[..s.char_indices().take_while(|(i, _)| *i < 200).last().map_or(0, |(i, _)| i)])
    } else {
        s.to_string()
    };
    super::lines::printable(&cut)
}

/// An external source. It keeps, per partition, the position and checkpoint
/// the host last gave it (at open) or acked, to re-open a restarted process.
pub struct ExternalSource {
    process: Process,
    streams: Vec<String>,
    resume: BTreeMap<u32, (u64, Option<String>)>,
    /// Checkpoints of batches handed to the host, by (partition, end), until
    /// an ack reaches them.
    checkpoints: BTreeMap<(u32, u64), Option<String>>,
    /// The running process answered `opened` to the current positions.
    opened: bool,
}

impl ExternalSource {
    /// Starts the plugin and learns its streams. Its lines may be up to
    /// [`source_line_bytes_max`] of `record_bytes_max`.
    pub fn start(
        name: &str,
        command: &str,
        timeout: Duration,
        record_bytes_max: u64,
    ) -> Result<ExternalSource, PluginError> {
        let line_bytes_max = source_line_bytes_max(record_bytes_max);
        let mut process = Process::new(name, command, "source", timeout, line_bytes_max);
        let streams = process.ensure()?.unwrap_or_default();
        if streams.is_empty() {
            return Err(process.err("declared no streams in its hello"));
        }
        for stream in &streams {
            skippr_core::rules::check_stream_name(stream).map_err(|why| process.err(format!("in its hello: {why}")))?;
        }
        Ok(ExternalSource { process, streams, resume: BTreeMap::new(), checkpoints: BTreeMap::new(), opened: false })
    }

    /// A process is read from or acked only once it has answered `opened`
    /// to the host's positions: a restarted one, or one whose open failed,
    /// is opened (again) first.
    fn reopen_if_restarted(&mut self) -> Result<(), PluginError> {
        if self.process.ensure()?.is_some() {
            self.opened = false;
        }
        if !self.opened {
            self.send_open()?;
            self.opened = true;
        }
        Ok(())
    }

    fn send_open(&mut self) -> Result<(), PluginError> {
        let resume: Vec<WireResume> = self
            .resume
            .iter()
            .map(|(&partition, (position, checkpoint))| WireResume {
                partition,
                position: *position,
                checkpoint: checkpoint.clone(),
            })
            .collect();
        let line = serde_json::json!({ "type": "open", "resume": resume }).to_string();
        self.process.request(&line, "opened").map(|_| ())
    }
}

impl Source for ExternalSource {
    fn streams(&self) -> Vec<String> {
        self.streams.clone()
    }

    fn refused(&self) -> Option<String> {
        self.process.too_long.clone()
    }

    fn open(&mut self, resume: &[ResumePoint]) -> Result<(), PluginError> {
        self.resume = resume
            .iter()
            .map(|r| {
                let checkpoint = r.checkpoint.as_ref().map(|c| String::from_utf8_lossy(c).into_owned());
                (r.partition, (r.position.0, checkpoint))
            })
            .collect();
        self.checkpoints.clear();
        self.opened = false;
        self.reopen_if_restarted()
    }

    fn read(&mut self, records_max: u32) -> Result<(Vec<Batch>, bool), PluginError> {
        self.reopen_if_restarted()?;
        let bytes_max = self.process.line_bytes_max;
        let line = self.process.request(
            &serde_json::json!({ "type": "read", "max": records_max, "bytes_max": bytes_max }).to_string(),
            "batch",
        )?;
        let reply: BatchReply = self.process.parse(&line)?;
        let mut batches = Vec::with_capacity(reply.batches.len());
        for b in reply.batches {
            self.checkpoints.insert((b.partition, b.end), b.checkpoint.clone());
            let records = b
                .records
                .into_iter()
                .map(|r| Record { position: Position(r.position), bytes: r.data.get().as_bytes().to_vec() })
                .collect();
            batches.push(Batch {
                partition: b.partition,
                stream: b.stream,
                records,
                end: Position(b.end),
                checkpoint: b.checkpoint.map(String::into_bytes),
                schema: b.schema.map(|s| s.get().as_bytes().to_vec()),
                window: skippr_core::Window::None,
                keys: Vec::new(),
            });
        }
        Ok((batches, reply.exhausted))
    }

    fn ack(&mut self, acks: &[(u32, Position)]) -> Result<(), PluginError> {
        for &(partition, position) in acks {
            let checkpoint = self.checkpoints.remove(&(partition, position.0)).flatten();
            self.checkpoints.retain(|&(p, end), _| p != partition || end > position.0);
            self.resume.insert(partition, (position.0, checkpoint));
        }
        self.reopen_if_restarted()?;
        let wire: Vec<_> = acks.iter().map(|(p, pos)| serde_json::json!({"partition": p, "position": pos.0})).collect();
        let line = serde_json::json!({ "type": "ack", "acks": wire }).to_string();
        self.process.request(&line, "acked").map(|_| ())
    }
}

/// An external sink.
pub struct ExternalSink {
    process: Process,
}

impl ExternalSink {
    pub fn start(name: &str, command: &str, timeout: Duration) -> Result<ExternalSink, PluginError> {
        let mut process = Process::new(name, command, "sink", timeout, REPLY_LINE_BYTES_MAX);
        process.ensure()?;
        Ok(ExternalSink { process })
    }
}

impl Sink for ExternalSink {
    fn apply(
        &mut self,
        stream: &str,
        seq: u64,
        id: CompactionId,
        records: &Records,
    ) -> Result<SinkOutcome, PluginError> {
        // Records are embedded as the exact bytes their source emitted, each
        // checked to be one JSON value: nothing in one can change the
        // message around it. One that is not (written to the WAL by a
        // release that did not check at intake) stops the stream.
        let mut values = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            match std::str::from_utf8(r).ok().and_then(|text| serde_json::from_str::<&RawValue>(text).ok()) {
                Some(value) if !value.get().contains(['\n', '\r']) => values.push(value),
                _ => {
                    tracing::error!(
                        plugin = %self.process.name, stream, seq, compaction_id = %id, record = i,
                        "a committed record is not exactly one JSON value on one line, so no sink plugin can be \
                         sent it: the stream stops"
                    );
                    return Ok(SinkOutcome::Fatal);
                }
            }
        }
        let request = ApplyRequest { kind: "apply", stream, seq, compaction_id: id.to_string(), records: values };
        let line = serde_json::to_string(&request).expect("a request encodes");
        self.process.ensure()?;
        let reply = self.process.request(&line, "result")?;
        let result: ResultReply = self.process.parse(&reply)?;
        let id_text = id.to_string();
        let speaks = self.process.running.as_ref().map_or(PROTOCOL_OLDEST, |r| r.speaks);
        if speaks >= 2 && (result.seq.is_none() || result.compaction_id.is_none()) {
            self.process.stop();
            return Err(self.process.err(format!(
                "broke the protocol: a version {speaks} result must echo the request's seq and compaction_id; \
                 restarted"
            )));
        }
        if result.seq.is_some_and(|s| s != seq) || result.compaction_id.as_ref().is_some_and(|c| *c != id_text) {
            self.process.stop();
            return Err(self.process.err(format!(
                "broke the protocol: it answered for seq {:?}, compaction_id {:?} a request for seq {seq}, \
                 compaction_id {id_text} (a stale or repeated answer); restarted",
                result.seq, result.compaction_id
            )));
        }
        let outcome = match result.outcome.as_str() {
            "applied" => SinkOutcome::Applied,
            "already_applied" => SinkOutcome::AlreadyApplied,
            "retryable" => SinkOutcome::Retryable,
            // A version 1 sink cannot name the records it cannot take.
            "fatal" if speaks < 2 => SinkOutcome::FatalUnnamed,
            "fatal" => SinkOutcome::Fatal,
            "refused" if speaks >= 2 => {
                let in_order = result.refused.windows(2).all(|w| w[0].index < w[1].index);
                let within = result.refused.last().is_some_and(|r| (r.index as usize) < records.len());
                if !in_order || !within {
                    self.process.stop();
                    return Err(self.process.err(format!(
                        "broke the protocol: `refused` must name records of the batch of {} by index, at least one, \
                         each once and in order; restarted",
                        records.len()
                    )));
                }
                let refused = result.refused.into_iter().map(|r| RefusedIndex { index: r.index, reason: r.reason });
                SinkOutcome::Refused(refused.collect())
            }
            other => return Err(self.process.err(format!("unknown outcome '{other}' (protocol {speaks})"))),
        };
        Ok(outcome)
    }
}

/// An external schema plugin: asked before a stream's first batch under a
/// schema the WAL has no decision for; never asked again once the decision is
/// committed.
pub struct ExternalSchema {
    process: Process,
}

impl ExternalSchema {
    pub fn start(name: &str, command: &str, timeout: Duration) -> Result<ExternalSchema, PluginError> {
        let mut process = Process::new(name, command, "schema", timeout, REPLY_LINE_BYTES_MAX);
        process.ensure()?;
        Ok(ExternalSchema { process })
    }
}

impl SchemaPlugin for ExternalSchema {
    fn decide(&mut self, stream: &str, fingerprint: u64, schema: &[u8]) -> Result<Option<String>, PluginError> {
        self.process.ensure()?;
        let schema = std::str::from_utf8(schema)
            .ok()
            .and_then(|text| serde_json::from_str::<&RawValue>(text).ok())
            .ok_or_else(|| self.process.err("a schema is not one JSON value"))?;
        let request = SchemaRequest { kind: "schema", stream, fingerprint: format!("{fingerprint:016x}"), schema };
        let line = serde_json::to_string(&request).expect("a request encodes");
        let reply = self.process.request(&line, "decision")?;
        let decision: DecisionReply = self.process.parse(&reply)?;
        Ok((!decision.accept).then_some(decision.reason))
    }
}
