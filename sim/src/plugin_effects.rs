//! What a plugin request does when it completes, in every topology (one
//! writer with a frozen twin, or raft hosts): a source's open, read or ack,
//! the schema plugin's answer, a sink's progress, and a sink's apply with
//! the faults a sink answers with. The topologies differ only in whose
//! sources answer, whose resume the checker judges, and how a reply is
//! scheduled; they call these and schedule what comes back.

use crate::checker::Checker;
use crate::plugins::{SimSink, SimSource};
use crate::rng::{Dice, Die};
use crate::scenario::Scenario;
use crate::world::RunStats;
use skippr_core::PluginOp;
use skippr_core::{Instant, IoError, IoReply, SinkApply, SinkOutcome};

/// The fault dice of a run, and whether faults strike now (the fault
/// phase).
pub struct Faults<'a> {
    pub dice: &'a mut Dice,
    pub on: bool,
}

impl Faults<'_> {
    /// A fault of kind `die` at `rate` strikes this request.
    pub fn strike(&mut self, die: Die, rate: f64) -> bool {
        self.on && self.dice.roll(die).chance(rate)
    }

    /// A delay in `lo..=hi` microseconds drawn from `die`.
    pub fn delay(&mut self, die: Die, (lo, hi): (u64, u64)) -> u64 {
        self.dice.roll(die).range(lo, hi.max(lo))
    }
}

/// Whether a plugin request other than a sink's apply fails as a source
/// failing does. Drawn before anything else about the request; opening a
/// source and asking a sink's progress never fail.
pub fn fails(faults: &mut Faults<'_>, scenario: &Scenario, stats: &mut RunStats, op: &PluginOp) -> bool {
    let fails = !matches!(op, PluginOp::SourceOpen { .. } | PluginOp::SinkProgress { .. })
        && faults.strike(Die::SourceFail, scenario.faults.source_fail);
    if fails {
        stats.source_failures += 1;
    }
    fails
}

/// A request that did not fail, performed: `sources` are the sending
/// process's. A source's resume is judged by the caller before this, since
/// whose resume counts depends on the topology.
pub fn perform(
    op: PluginOp,
    sources: &mut [SimSource],
    sinks: &[SimSink],
    checker: &mut Checker,
    stats: &mut RunStats,
    now: Instant,
) -> Result<IoReply, IoError> {
    match op {
        PluginOp::SourceOpen { source, resume, .. } => {
            sources[source.0 as usize].open(&resume);
            Ok(IoReply::Done)
        }
        PluginOp::SourceRead { source, records_max } => {
            let (batches, exhausted) = sources[source.0 as usize].read(records_max, now);
            Ok(IoReply::Batches { batches, exhausted })
        }
        PluginOp::SourceAck { source, acks } => {
            let src = &sources[source.0 as usize];
            checker.on_ack(source, &acks, |p| src.sent(p));
            sources[source.0 as usize].ack(&acks);
            Ok(IoReply::Done)
        }
        PluginOp::SchemaDecide { .. } => {
            stats.schema_decisions += 1;
            Ok(IoReply::Schema { accept: true, reason: String::new() })
        }
        PluginOp::SinkApply(_) => unreachable!("sink applies go through sink_effect"),
        PluginOp::SinkProgress { sink } => Ok(IoReply::SinkProgress(sinks[sink.0 as usize].progress())),
    }
}

/// A sink applies a batch at its completion time, whether or not its
/// sender still runs (the request has left it): the sink may ask for a
/// retry, or apply (its ledger's verdict, seen by the checker) and lose its
/// reply. Returns the reply and the delay, in microseconds, after which
/// it reaches the sender.
pub fn sink_effect(
    faults: &mut Faults<'_>,
    scenario: &Scenario,
    stats: &mut RunStats,
    sinks: &mut [SimSink],
    checker: &mut Checker,
    apply: &SinkApply,
) -> (u64, Result<IoReply, IoError>) {
    let f = &scenario.faults;
    let latency = scenario.latencies.sink;
    let reply_latency = (latency.0 / 2, latency.0);
    if faults.strike(Die::SinkRetryable, f.sink_retryable) {
        stats.sink_retryable += 1;
        let result = Ok(IoReply::Sink { outcome: SinkOutcome::Retryable, rows: 0 });
        return (faults.delay(Die::SinkLatency, reply_latency), result);
    }
    let verdict = sinks[apply.sink.0 as usize].apply(apply.id, apply.stream, apply.seq, &apply.records);
    checker.on_apply(apply, verdict);
    let result = if faults.strike(Die::SinkLostReply, f.sink_lost_reply) {
        stats.sink_lost_replies += 1;
        Err(IoError::Ambiguous)
    } else {
        Ok(IoReply::Sink { outcome: verdict.outcome(), rows: apply.records.len() as u64 })
    };
    (faults.delay(Die::SinkLatency, reply_latency), result)
}
