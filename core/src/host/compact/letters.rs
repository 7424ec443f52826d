//! Refusals, as the compaction part handles them: a sink's answer that
//! refuses records turned into the `Refusal` frame that records the
//! decision, each attempt of a plan (its records without those refused
//! before it), and the dead-letter batch of the refusals that stand once the
//! plan settles. Pure functions of the plan, its committed refusals and the
//! records gathered for it, so a replay sends the same bytes under the same
//! ids.

use crate::compaction::without;
use crate::config::HostConfig;
use crate::dead_letters::{kept_reason, quarantined, Letter, LetterRecord, FATAL_ALONE};
use crate::ids::*;
use crate::io::{Records, RefusedIndex, StopReason};
use crate::records::Gathered;
use crate::wal::{CompactionPlan, Frame, Range, Refusal, RefusedRecord, Settled, Split};
use std::cmp::Ordering;
use std::collections::BTreeSet;

/// An attempt: the records gathered for the plan within `ranges` (the
/// plan's, or as its last split before the attempt cut them) less every
/// record `refusals` refused and every record quarantined at intake, where
/// each of those is, and how many quarantined records were left out.
/// `quarantine_sent` is the planted bug `quarantine-sent`.
pub(super) fn attempt(
    gathered: Gathered,
    ranges: &[Range],
    refusals: &[Refusal],
    quarantine_sent: bool,
) -> (Gathered, u64) {
    let refused: BTreeSet<(PartitionKey, Position)> =
        refusals.iter().flat_map(|r| r.records.iter().map(|x| (x.key, x.position))).collect();
    let any_quarantined = gathered.records.iter().any(|r| quarantined(r).is_some());
    if refused.is_empty() && gathered.places.iter().all(|&place| within(ranges, place)) && !any_quarantined {
        return (gathered, 0);
    }
    let (mut out, mut left_out) = (Gathered::default(), 0);
    for (record, place) in gathered.records.iter().zip(gathered.places) {
        if !within(ranges, place) || refused.contains(&place) {
            continue;
        }
        match quarantined(record) {
            // The planted bug: sent as the source sent it.
            Some(q) if quarantine_sent => out.records.push(q.record),
            Some(_) => {
                left_out += 1;
                continue;
            }
            None => out.records.push(record),
        }
        out.places.push(place);
    }
    (out, left_out)
}

/// Whether a plan holds what only dead letters can take: committed
/// refusals, or records quarantined at intake (a run with dead letters on
/// decided them).
pub(super) fn undeliverable(chain: super::Chain<'_>, gathered: &Gathered) -> bool {
    !chain.refusals.is_empty() || gathered.records.iter().any(|r| quarantined(r).is_some())
}

/// Whether a record is in one of `ranges`.
pub(super) fn within(ranges: &[Range], (key, position): (PartitionKey, Position)) -> bool {
    ranges.iter().any(|r| r.key == key && position >= r.from && position < r.to)
}

/// What `fatal` for every version of a plan without refusals decides (dead
/// letters on): its last version, attempt `attempt` of `ranges` whose
/// records are `sent`, is cut to the first half of them (`Split`); a
/// version of one record has that record refused (`Refusal`). A pure
/// function of the plan and its committed versions, so a replay of the
/// decision is the same. `None` for a version with no record.
pub(super) fn split(
    (plan, attempt): (&CompactionPlan, CompactionId),
    ranges: &[Range],
    sent: &[(PartitionKey, Position)],
    at_ms: u64,
) -> Option<Frame> {
    let (sink, stream, seq) = (plan.sink, plan.stream, plan.seq);
    match *sent {
        [] => None,
        [(key, position)] => {
            let records = vec![RefusedRecord { key, position, reason: FATAL_ALONE.to_string() }];
            let then = without(attempt, &records);
            Some(Frame::Refused(Refusal { sink, stream, id: attempt, seq, then, at_ms, records }))
        }
        _ => {
            let (key, at) = sent[sent.len() / 2];
            let cut = |r: &Range| match r.key.cmp(&key) {
                Ordering::Less => r.to,
                Ordering::Equal => at,
                Ordering::Greater => r.from,
            };
            let ranges: Vec<Range> = ranges.iter().map(|r| Range { key: r.key, from: r.from, to: cut(r) }).collect();
            let then = crate::compaction::cut(attempt, &ranges);
            Some(Frame::Split(Split { sink, stream, id: attempt, seq, then, ranges }))
        }
    }
}

/// A refused attempt as a refusal frame: where each refused record of
/// the batch `sent` is, with its reason kept (cut to its bound). A list
/// that does not name records of the batch, each once and in order, breaks
/// the protocol.
pub(super) fn decide(
    (plan, attempt): (&CompactionPlan, CompactionId),
    sent: &[(PartitionKey, Position)],
    refused: Vec<RefusedIndex>,
    at_ms: u64,
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
    Ok(Refusal { sink: plan.sink, stream: plan.stream, id: attempt, seq: plan.seq, then, at_ms, records })
}

/// The dead-letter batch of a settled plan: one line per record of the
/// refusals that stand, then one per record quarantined at intake within
/// the ranges of the attempt the sink holds (`held`, whose id the letter
/// names), from the records gathered for the plan.
pub(super) fn letters(
    cfg: &HostConfig,
    standing: &[Refusal],
    held: (&Settled, &[Range]),
    gathered: &Gathered,
) -> Records {
    let mut out = Records::default();
    let (settled, ranges) = held;
    let names = (
        cfg.streams[settled.stream.0 as usize].as_str(),
        cfg.sinks[settled.sink.0 as usize].as_str(),
        |source: SourceId| cfg.sources[source.0 as usize].as_str(),
    );
    for refusal in standing {
        let at = |x: &RefusedRecord| gathered.places.binary_search(&(x.key, x.position)).ok();
        push_letters(&mut out, refusal, names, at, &gathered.records);
    }
    let mut line = Vec::new();
    for (record, &(key, position)) in gathered.records.iter().zip(&gathered.places) {
        let Some(q) = quarantined(record).filter(|_| within(ranges, (key, position))) else { continue };
        let letter = Letter {
            stream: names.0,
            sink: names.1,
            source: (names.2)(key.source),
            partition: key.partition,
            position,
            compaction_id: settled.held,
            seq: settled.seq,
            reason: q.reason,
            at_ms: q.at_ms,
            record: LetterRecord::Intake(q.record),
        };
        line.clear();
        letter.write(&mut line);
        out.push(&line);
    }
    out
}

/// The planted bug `dead-letters-before-decision`: the dead letters of a
/// refusal not yet committed, from the attempt's records as sent (names
/// left out).
pub(super) fn early(refusal: &Refusal, sent: &[(PartitionKey, Position)], records: &Records) -> Records {
    let mut out = Records::default();
    let at = |x: &RefusedRecord| sent.iter().position(|&p| p == (x.key, x.position));
    push_letters(&mut out, refusal, ("?", "?", |_| "?"), at, records);
    out
}

/// Appends a dead letter for each record of `refusal`, found in `records`
/// at the index `at` gives.
fn push_letters<'a>(
    out: &mut Records,
    refusal: &Refusal,
    (stream, sink, source): (&str, &str, impl Fn(SourceId) -> &'a str),
    at: impl Fn(&RefusedRecord) -> Option<usize>,
    records: &Records,
) {
    let mut line = Vec::new();
    for x in &refusal.records {
        let i = at(x).expect("a refused record is among its plan's records, which a replay gathers again");
        let letter = Letter {
            stream,
            sink,
            source: source(x.key.source),
            partition: x.key.partition,
            position: x.position,
            compaction_id: refusal.id,
            seq: refusal.seq,
            reason: &x.reason,
            at_ms: refusal.at_ms,
            record: LetterRecord::Json(records.get(i).expect("an index of the batch")),
        };
        line.clear();
        letter.write(&mut line);
        out.push(&line);
    }
}
