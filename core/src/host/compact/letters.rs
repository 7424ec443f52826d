//! Refusals, as the compaction part handles them: a sink's answer that
//! refuses records turned into the `Refusal` frame that records the
//! decision, the attempt that is sent after it (the plan's records without
//! every record refused so far), and the dead-letter batch each refusal
//! makes. Pure functions of the plan, its committed refusals and the
//! records gathered for it, so a replay sends the same bytes under the same
//! ids.

use crate::compaction::without;
use crate::config::HostConfig;
use crate::dead_letters::{kept_reason, Letter};
use crate::ids::*;
use crate::io::{Records, RefusedIndex, StopReason};
use crate::records::Gathered;
use crate::wal::{CompactionPlan, Refusal, RefusedRecord};
use std::collections::BTreeSet;

/// What the sink is sent for `plan` after `refusals`: the records gathered
/// for it less every record refused, and where each of those is.
pub(super) fn attempt(gathered: Gathered, refusals: &[Refusal]) -> Gathered {
    if refusals.is_empty() {
        return gathered;
    }
    let refused: BTreeSet<(PartitionKey, Position)> =
        refusals.iter().flat_map(|r| r.records.iter().map(|x| (x.key, x.position))).collect();
    let mut out = Gathered::default();
    for (record, place) in gathered.records.iter().zip(gathered.places) {
        if !refused.contains(&place) {
            out.records.push(record);
            out.places.push(place);
        }
    }
    out
}

/// A refused attempt as a refusal frame: where each refused record of
/// the batch `sent` is, with its reason kept (cut to its bound). A list
/// that does not name records of the batch, each once and in order, breaks
/// the protocol.
pub(super) fn decide(
    (plan, attempt): (&CompactionPlan, CompactionId),
    sent: &[(PartitionKey, Position)],
    refused: Vec<RefusedIndex>,
    (letters, at_ms): (CompactionSeq, u64),
) -> Result<Refusal, StopReason> {
    let in_order = refused.windows(2).all(|w| w[0].index < w[1].index);
    let last = refused.last().map(|r| r.index as usize);
    if !in_order || last.is_none_or(|i| i >= sent.len()) {
        let what = format!(
            "a refusal must name records of the batch of {} by index, each once and in order; it named {:?}",
            sent.len(),
            refused.iter().map(|r| r.index).collect::<Vec<_>>()
        );
        return Err(StopReason::SinkProtocol { sink: plan.sink, stream: plan.stream, what });
    }
    let records: Vec<RefusedRecord> = refused
        .into_iter()
        .map(|r| {
            let (key, position) = sent[r.index as usize];
            RefusedRecord { key, position, reason: kept_reason(&r.reason) }
        })
        .collect();
    let then = without(attempt, &records);
    Ok(Refusal { sink: plan.sink, stream: plan.stream, id: attempt, seq: plan.seq, then, letters, at_ms, records })
}

/// The dead-letter batch of `refusal`: one line per refused record, from
/// the records gathered for its plan.
pub(super) fn letters(cfg: &HostConfig, refusal: &Refusal, gathered: &Gathered) -> Records {
    let mut out = Records::default();
    let mut line = Vec::new();
    for x in &refusal.records {
        let i = gathered
            .places
            .binary_search(&(x.key, x.position))
            .expect("a refused record is among its plan's records, which a replay gathers again");
        let letter = Letter {
            stream: &cfg.streams[refusal.stream.0 as usize],
            sink: &cfg.sinks[refusal.sink.0 as usize],
            source: &cfg.sources[x.key.source.0 as usize],
            partition: x.key.partition,
            position: x.position,
            compaction_id: refusal.id,
            seq: refusal.seq,
            reason: &x.reason,
            at_ms: refusal.at_ms,
            record: gathered.records.get(i).expect("an index of the batch"),
        };
        line.clear();
        letter.write(&mut line);
        out.push(&line);
    }
    out
}
