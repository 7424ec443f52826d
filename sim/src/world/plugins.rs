//! What a plugin request does when it completes, in every topology: a
//! source's open, read or ack, the schema plugin's answer, a sink's
//! progress, and a sink's apply with the faults a sink answers with. The
//! topologies differ only in whose resume the checker judges and how a
//! reply is scheduled.

use super::{Topology, World};
use crate::rng::{Dice, Die};
use skippr_core::PluginOp;
use skippr_core::{Duration, IoError, IoReply, SinkApply, SinkOutcome};

/// The fault dice of a run, and whether faults strike now (the fault
/// phase).
pub(crate) struct Faults<'a> {
    pub dice: &'a mut Dice,
    pub on: bool,
}

impl Faults<'_> {
    /// A fault of kind `die` at `rate` strikes this request.
    pub fn strike(&mut self, die: Die, rate: f64) -> bool {
        self.on && self.dice.roll(die).chance(rate)
    }
}

impl<T: Topology> World<T> {
    /// A plugin request other than a sink's apply, performed at its
    /// completion by slot `slot`'s sources. `judged`: the offsets store
    /// against which this process's resume is judged, if it counts.
    pub fn complete_plugin(&mut self, slot: usize, op: PluginOp, judged: Option<usize>) -> Result<IoReply, IoError> {
        // Whether it fails as a source failing does is drawn before
        // anything else; opening a source and asking a sink's progress
        // never fail.
        let fails = !matches!(op, PluginOp::SourceOpen { .. } | PluginOp::SinkProgress { .. })
            && self.fault(Die::SourceFail, self.scenario.faults.source_fail);
        if fails {
            self.stats.source_failures += 1;
            return Err(IoError::Failed);
        }
        if let (PluginOp::SourceOpen { source, resume, .. }, Some(store)) = (&op, judged) {
            let offsets = &self.stores[store];
            self.checker.on_resume(*source, resume, |key| offsets.position(key));
        }
        let now = self.now();
        let sources = &mut self.procs[slot].sources;
        match op {
            PluginOp::SourceOpen { source, resume, .. } => {
                sources[source.0 as usize].open(&resume);
                Ok(IoReply::Done)
            }
            PluginOp::SourceRead { source, records_max } => {
                let (batches, exhausted) = sources[source.0 as usize].read(records_max, now);
                for b in &batches {
                    self.stats.tap_starts += (b.window == skippr_core::Window::Restart) as u64;
                    self.stats.tap_windows += (b.window == skippr_core::Window::Close) as u64;
                }
                Ok(IoReply::Batches { batches, exhausted })
            }
            PluginOp::SourceAck { source, acks } => {
                let src = &sources[source.0 as usize];
                self.checker.on_ack(source, &acks, |p| src.sent(p));
                sources[source.0 as usize].ack(&acks);
                Ok(IoReply::Done)
            }
            PluginOp::SchemaDecide { .. } => {
                self.stats.schema_decisions += 1;
                Ok(IoReply::Schema { accept: true, reason: String::new() })
            }
            PluginOp::SinkApply(_) => unreachable!("sink applies go through sink_effect"),
            PluginOp::DeadLetters(_) => unreachable!("dead letters go through letters_effect"),
            PluginOp::SinkProgress { sink } => Ok(IoReply::SinkProgress(self.sinks[sink.0 as usize].progress())),
        }
    }

    /// How long a sink apply takes to reach the sink: its latency, or (a
    /// sink with poison) a linger of 0.2–2 s, so that one sent by a
    /// process that died may land after its successor split the batch.
    pub fn sink_latency(&mut self) -> (Die, (u64, u64)) {
        let poison = &self.scenario.poison;
        match poison.on && self.fault(Die::Linger, poison.linger) {
            true => (Die::Linger, (200_000, 2_000_000)),
            false => (Die::SinkLatency, self.scenario.latencies.sink),
        }
    }

    /// A sink applies a batch at its completion time, whether or not its
    /// sender still runs (the request has left it): the sink may ask for a
    /// retry, or apply (its ledger's verdict, seen by the checker) and lose
    /// its reply. Returns the reply and the delay after which it reaches
    /// the sender.
    pub fn sink_effect(&mut self, apply: &SinkApply) -> (Duration, Result<IoReply, IoError>) {
        let f = &self.scenario.faults;
        let (retryable, lost_reply) = (f.sink_retryable, f.sink_lost_reply);
        let latency = self.scenario.latencies.sink;
        let reply_latency = (latency.0 / 2, latency.0);
        if self.fault(Die::SinkRetryable, retryable) {
            self.stats.sink_retryable += 1;
            let result = Ok(IoReply::Sink { outcome: SinkOutcome::Retryable, rows: 0 });
            return (self.delay(Die::SinkLatency, reply_latency), result);
        }
        let (poison, seed) = (&self.scenario.poison, self.scenario.seed);
        let new = self.sinks[apply.sink.0 as usize].is_new(apply.stream, apply.seq);
        if poison.on && new && self.sinks[apply.sink.0 as usize].poison_fatal(poison, seed, &apply.records) {
            // A version 1 sink that cannot name the record: the batch is
            // fatal (every time, or the first time it holds each).
            self.stats.sink_poisoned += 1;
            self.poisoned.insert((apply.sink, apply.stream, apply.seq), apply.records.clone());
            let result = Ok(IoReply::Sink { outcome: SinkOutcome::FatalUnnamed, rows: 0 });
            return (self.delay(Die::SinkLatency, reply_latency), result);
        }
        // A sink with poison is a version 1 sink: it refuses no record by
        // name.
        if self.scenario.letters.on && !self.scenario.poison.on && new {
            let (spec, seed) = (&self.scenario.letters, self.scenario.seed);
            let refused = self.sinks[apply.sink.0 as usize].refusals(spec, seed, &apply.records);
            if !refused.is_empty() {
                self.stats.sink_refusals += 1;
                let result = Ok(IoReply::Sink { outcome: SinkOutcome::Refused(refused), rows: 0 });
                return (self.delay(Die::SinkLatency, reply_latency), result);
            }
        }
        let verdict = self.sinks[apply.sink.0 as usize].apply(apply.id, apply.stream, apply.seq, &apply.records);
        self.checker.on_apply(apply, verdict);
        let result = if self.fault(Die::SinkLostReply, lost_reply) {
            self.stats.sink_lost_replies += 1;
            Err(IoError::Ambiguous)
        } else {
            // A sink with poison speaks version 1: its `fatal` for another
            // batch under the number names nothing either.
            let outcome = match verdict.outcome() {
                SinkOutcome::Fatal if self.scenario.poison.on => SinkOutcome::FatalUnnamed,
                outcome => outcome,
            };
            Ok(IoReply::Sink { outcome, rows: apply.records.len() as u64 })
        };
        (self.delay(Die::SinkLatency, reply_latency), result)
    }

    /// The dead-letter destination applies a batch of dead letters, as a
    /// sink does (its own ledger), with faults of its own.
    pub fn letters_effect(&mut self, apply: &SinkApply) -> (Duration, Result<IoReply, IoError>) {
        let (retryable, lost_reply) = (self.scenario.letters.retryable, self.scenario.letters.lost_reply);
        let latency = self.scenario.latencies.sink;
        let reply_latency = (latency.0 / 2, latency.0);
        if self.fault(Die::Letters, retryable) {
            let result = Ok(IoReply::Sink { outcome: SinkOutcome::Retryable, rows: 0 });
            return (self.delay(Die::SinkLatency, reply_latency), result);
        }
        let verdict = self.letters[apply.sink.0 as usize].apply(apply.id, apply.stream, apply.seq, &apply.records);
        if verdict == skippr_core::ledger::Verdict::New && apply.sink.0 == 0 {
            let log = &mut self.letter_log[apply.stream.0 as usize];
            log.extend(apply.records.iter().filter_map(crate::checker::letter_record).map(|r| r.into_owned()));
        }
        self.checker.on_letters(apply, verdict);
        let result = if self.fault(Die::Letters, lost_reply) {
            Err(IoError::Ambiguous)
        } else {
            Ok(IoReply::Sink { outcome: verdict.outcome(), rows: apply.records.len() as u64 })
        };
        (self.delay(Die::SinkLatency, reply_latency), result)
    }

    /// A delay in `lo..=hi` microseconds drawn from `die`.
    pub fn delay(&mut self, die: Die, (lo, hi): (u64, u64)) -> Duration {
        Duration::from_micros(self.dice.roll(die).range(lo, hi.max(lo)))
    }
}
