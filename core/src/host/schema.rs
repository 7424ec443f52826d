//! Schema decisions: the schema each stream's records are accepted under,
//! and the batches (of any source) held while the schema plugin is asked
//! about a new one. A decision is a frame, committed before the batches it
//! admits and never asked again once committed. Talks only to [`Effects`].

use super::effects::{Effects, Pending, Retry};
use crate::ids::*;
use crate::io::PluginOp;
use crate::io::{IoError, IoOp, SourceBatchIn, StopReason};
use crate::wal::{Frame, SchemaDecision};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

#[derive(Default)]
pub(super) struct Schemas {
    /// Per stream: committed, or decided and waiting in the pending group.
    live: BTreeMap<StreamId, u64>,
    /// A decision asked for and not yet answered, per stream.
    waits: BTreeMap<StreamId, Wait>,
}

struct Wait {
    fingerprint: u64,
    schema: Arc<[u8]>,
    batches: VecDeque<(SourceId, SourceBatchIn)>,
}

/// A batch that may go in, with the decision to commit ahead of it, if any;
/// `None` when the batch is held until the plugin decides.
pub(super) type Gate = Option<(SourceBatchIn, Option<Frame>)>;

/// The plugin's answer.
pub(super) enum Decided {
    /// Failed: asked again after a backoff.
    Retry,
    Rejected(StopReason),
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
        if let Some(wait) = self.waits.get_mut(&stream) {
            wait.batches.push_back((source, batch));
            return None;
        }
        let Some(schema) = batch.schema.clone() else { return Some((batch, None)) };
        let fingerprint = xxhash_rust::xxh3::xxh3_64(&schema);
        if self.live.get(&stream) == Some(&fingerprint) {
            return Some((batch, None));
        }
        if !plugin {
            let decision = self.decide(stream, fingerprint);
            return Some((batch, Some(decision)));
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

    pub(super) fn on_decided(
        &mut self,
        fx: &mut Effects,
        stream: StreamId,
        result: Result<(bool, String), IoError>,
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
