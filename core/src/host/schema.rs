//! Schema decisions: the schema each stream's records are accepted under,
//! and the batches (of any source) held while the schema plugin is asked
//! about a new one. A decision is a frame, committed before the batches it
//! admits and never asked again once committed. Talks only to [`Effects`].

use super::effects::{Effects, Pending, Retry};
use crate::ids::*;
use crate::io::PluginOp;
use crate::io::{IoError, IoOp, SourceBatchIn, StopReason, Window};
use crate::wal::{Frame, SchemaDecision};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

#[derive(Default)]
pub(super) struct Schemas {
    /// Per stream: committed, or decided and waiting in the pending group.
    live: BTreeMap<StreamId, u64>,
    /// A decision asked for and not yet answered, per stream.
    waits: BTreeMap<StreamId, Wait>,
    /// With dead letters on, the schemas the plugin refused in this run,
    /// and why: their records are let in quarantined.
    refused: BTreeMap<(StreamId, u64), String>,
}

struct Wait {
    fingerprint: u64,
    schema: Arc<[u8]>,
    batches: VecDeque<(SourceId, SourceBatchIn)>,
}

/// A batch that may go in, with the decision to commit ahead of it, if any,
/// or, under a schema the plugin refused (dead letters on), why: each of its
/// records goes in quarantined. `None` when the batch is held until the
/// plugin decides.
pub(super) type Gate = Option<(SourceBatchIn, Result<Option<Frame>, String>)>;

/// The plugin's answer.
pub(super) enum Decided {
    /// Failed: asked again after a backoff.
    Retry,
    Rejected(StopReason),
    /// Refused with dead letters on: let the held batches in again (each
    /// under the refused schema goes in quarantined).
    Refused(VecDeque<(SourceId, SourceBatchIn)>),
    /// Accepted: commit `decision`, then let the held batches in, in order.
    Accepted {
        decision: Box<Frame>,
        batches: VecDeque<(SourceId, SourceBatchIn)>,
    },
}

impl Schemas {
    pub(super) fn restore(&mut self, committed: &BTreeMap<StreamId, u64>) {
        self.live = committed.clone();
    }

    /// A batch arrives: it waits behind an open question about its stream,
    /// opens one (`plugin`: a schema plugin decides), or passes.
    pub(super) fn gate(&mut self, fx: &mut Effects, source: SourceId, batch: SourceBatchIn, plugin: bool) -> Gate {
        let stream = batch.stream;
        // A window's batches keep their source's order across streams:
        // behind any batch of the source that waits (section 22).
        if batch.window != Window::None {
            let holding = self.waits.values_mut().find(|w| w.batches.iter().any(|(s, _)| *s == source));
            if let Some(wait) = holding {
                wait.batches.push_back((source, batch));
                return None;
            }
        }
        if let Some(wait) = self.waits.get_mut(&stream) {
            wait.batches.push_back((source, batch));
            return None;
        }
        let Some(schema) = batch.schema.clone() else { return Some((batch, Ok(None))) };
        let fingerprint = xxhash_rust::xxh3::xxh3_64(&schema);
        if self.live.get(&stream) == Some(&fingerprint) {
            return Some((batch, Ok(None)));
        }
        if let Some(reason) = self.refused.get(&(stream, fingerprint)) {
            return Some((batch, Err(reason.clone())));
        }
        if !plugin {
            let decision = self.decide(stream, fingerprint);
            return Some((batch, Ok(Some(decision))));
        }
        let batches = VecDeque::from([(source, batch)]);
        self.waits.insert(stream, Wait { fingerprint, schema, batches });
        self.ask(fx, stream);
        None
    }

    pub(super) fn ask(&mut self, fx: &mut Effects, stream: StreamId) {
        let Some(wait) = self.waits.get(&stream) else { return };
        let op = IoOp::Plugin(PluginOp::SchemaDecide {
            stream,
            fingerprint: wait.fingerprint,
            schema: Arc::clone(&wait.schema),
        });
        fx.io(Pending::SchemaDecide(stream), op);
    }

    /// The plugin answered. A refusal stops the engine, or, with dead
    /// letters on (`letters`), is remembered for this run and lets the
    /// batches in quarantined (a restart asks again: what it refused is
    /// committed quarantined by then).
    pub(super) fn on_decided(
        &mut self,
        fx: &mut Effects,
        stream: StreamId,
        result: Result<(bool, String), IoError>,
        letters: bool,
    ) -> Decided {
        let (accept, reason) = match result {
            Ok(answer) => answer,
            Err(_) => {
                fx.retry_later(Retry::SchemaDecide(stream));
                return Decided::Retry;
            }
        };
        fx.succeeded(Retry::SchemaDecide(stream));
        let wait = self.waits.remove(&stream).expect("a decision answers a wait");
        if !accept && letters {
            let reason = format!("{}: the schema plugin refused its schema: {reason}", crate::dead_letters::AT_INTAKE);
            self.refused.insert((stream, wait.fingerprint), reason);
            return Decided::Refused(wait.batches);
        }
        if !accept {
            let fingerprint = wait.fingerprint;
            return Decided::Rejected(StopReason::SchemaRejected { stream, fingerprint, reason });
        }
        Decided::Accepted { decision: Box::new(self.decide(stream, wait.fingerprint)), batches: wait.batches }
    }

    fn decide(&mut self, stream: StreamId, fingerprint: u64) -> Frame {
        self.live.insert(stream, fingerprint);
        Frame::SchemaDecision(SchemaDecision { stream, fingerprint })
    }

    /// Some batch of `source` waits for a decision: the source is not read.
    pub(super) fn holds(&self, source: SourceId) -> bool {
        self.waits.values().any(|w| w.batches.iter().any(|(s, _)| *s == source))
    }

    pub(super) fn idle(&self) -> bool {
        self.waits.is_empty()
    }
}
