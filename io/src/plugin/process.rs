//! External plugins: child processes speaking the runtime protocol, version
//! 1 (docs/PROTOCOL.md), as JSON lines on stdin and stdout, logs on stderr.
//!
//! A plugin that exits, hangs past its timeout, or prints a line that is not
//! protocol JSON is killed; the request fails with an error that names the
//! plugin (and the line), and the engine retries with backoff. The next
//! request starts the plugin again and re-opens it from host-provided state:
//! the positions the host acked, never anything the plugin kept itself.

use super::{Batch, PluginError, SchemaPlugin, Sink, Source};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use skippr_core::wal::Record;
use skippr_core::{CompactionId, Position, Records, ResumePoint, SinkOutcome};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use tracing::{info, warn};

pub const PROTOCOL_VERSION: u32 = 1;

/// One plugin process and its line channel.
struct Process {
    name: String,
    command: String,
    role: &'static str,
    timeout: Duration,
    running: Option<Running>,
}

struct Running {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Option<String>>,
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
}

#[derive(Deserialize)]
struct ErrorReply {
    message: String,
}

impl Process {
    fn new(name: &str, command: &str, role: &'static str, timeout: Duration) -> Process {
        Process { name: name.into(), command: command.into(), role, timeout, running: None }
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
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(Some(l)).is_err() {
                            return;
                        }
                    }
                    Err(_) => break,
                }
            }
            let _ = tx.send(None);
        });
        let name = self.name.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                info!(plugin = %name, "{line}");
            }
        });
        self.running = Some(Running { child, stdin, lines: rx });
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
        if reply.protocol != PROTOCOL_VERSION {
            self.stop();
            return Err(self.err(format!("speaks protocol {}, this host speaks {PROTOCOL_VERSION}", reply.protocol)));
        }
        Ok(Some(reply.streams))
    }

    /// Sends one line and waits for the reply of type `expect`.
    fn request(&mut self, line: &str, expect: &str) -> Result<String, PluginError> {
        let timeout = self.timeout;
        let running = self.running.as_mut().expect("started");
        if let Err(e) = writeln!(running.stdin, "{line}").and_then(|_| running.stdin.flush()) {
            let status = self.stop();
            return Err(self.err(format!("cannot write to it ({e}); it {status}")));
        }
        let reply = match running.lines.recv_timeout(timeout) {
            Ok(Some(reply)) => reply,
            Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.stop();
                return Err(self.err(format!("it {status}")));
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
                let _ = r.child.kill();
                let _ = r.child.wait();
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
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}

/// A line cut to 200 bytes for a message.
pub(crate) fn clip(s: &str) -> String {
    if s.len() > 200 {
        format!("{}...", &s[..s.char_indices().take_while(|(i, _)| *i < 200).last().map_or(0, |(i, _)| i)])
    } else {
        s.to_string()
    }
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
    /// Starts the plugin and learns its streams.
    pub fn start(name: &str, command: &str, timeout: Duration) -> Result<ExternalSource, PluginError> {
        let mut process = Process::new(name, command, "source", timeout);
        let streams = process.ensure()?.unwrap_or_default();
        if streams.is_empty() {
            return Err(process.err("declared no streams in its hello"));
        }
        if let Some(bad) = streams
            .iter()
            .find(|s| s.is_empty() || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
        {
            return Err(process.err(format!("declared the stream name {bad:?}: use letters, digits, '-' and '_'")));
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
        let line = self.process.request(&format!(r#"{{"type":"read","max":{records_max}}}"#), "batch")?;
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
        let mut process = Process::new(name, command, "sink", timeout);
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
        self.process.ensure()?;
        // Records are JSON values with the exact bytes their source emitted:
        // they are spliced in, never re-encoded.
        let mut line = format!(
            r#"{{"type":"apply","stream":{},"seq":{seq},"compaction_id":"{id}","records":["#,
            serde_json::to_string(stream).expect("a string encodes")
        );
        for (i, r) in records.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            line.push_str(std::str::from_utf8(r).map_err(|_| self.process.err("a record is not UTF-8 JSON"))?);
        }
        line.push_str("]}");
        let reply = self.process.request(&line, "result")?;
        let result: ResultReply = self.process.parse(&reply)?;
        let outcome = match result.outcome.as_str() {
            "applied" => SinkOutcome::Applied,
            "already_applied" => SinkOutcome::AlreadyApplied,
            "retryable" => SinkOutcome::Retryable,
            "fatal" => SinkOutcome::Fatal,
            other => return Err(self.process.err(format!("unknown outcome '{other}'"))),
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
        let mut process = Process::new(name, command, "schema", timeout);
        process.ensure()?;
        Ok(ExternalSchema { process })
    }
}

impl SchemaPlugin for ExternalSchema {
    fn decide(&mut self, stream: &str, fingerprint: u64, schema: &[u8]) -> Result<Option<String>, PluginError> {
        self.process.ensure()?;
        let schema = std::str::from_utf8(schema).map_err(|_| self.process.err("a schema is not UTF-8 JSON"))?;
        let line = format!(
            r#"{{"type":"schema","stream":{},"fingerprint":"{fingerprint:016x}","schema":{schema}}}"#,
            serde_json::to_string(stream).expect("a string encodes")
        );
        let reply = self.process.request(&line, "decision")?;
        let decision: DecisionReply = self.process.parse(&reply)?;
        Ok((!decision.accept).then_some(decision.reason))
    }
}
