//! The stop record: written at a stop on SIGTERM with the WAL consistent
//! (drained, or timed out behind a lagging sink), used by the next start
//! instead of a scan when the WAL still matches it, set aside when a later
//! run changed the WAL; what it spares is never what a scan would find
//! otherwise.

use super::*;
use crate::io::StopRecordUse;
use std::collections::BTreeSet;

/// A run that commits records `0..4`, then stops on SIGTERM; the sink
/// applies the compaction when `sink_answers`, and otherwise never answers
/// (the drain times out).
fn run_then_stop(sink_answers: bool) -> Harness {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 4);
    h.host.handle(h.now, Input::Shutdown);
    h.settle();
    let (ack, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceAck { .. })).then_some(()));
    h.answer(ack, Ok(IoReply::Done));
    let (read, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    h.answer(read, Ok(IoReply::Batches { batches: vec![], exhausted: false }));
    if sink_answers {
        let (apply, ..) = h.sink_apply();
        h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 4 }));
    } else {
        for _ in 0..1000 {
            if h.stopped.is_some() {
                break;
            }
            let (at, _) = h.host.poll_timeout().expect("the drain deadline");
            h.now = at;
            h.host.handle(at, Input::Timeout);
            h.settle();
        }
    }
    h
}

/// A new engine on `h`'s disk and offsets, with `record` as its stop record.
fn restart(h: &Harness, record: Option<Vec<u8>>, cfg: HostConfig) -> Harness {
    let mut next = Harness::unsettled(cfg, h.disk.clone(), h.offsets.clone(), Vec::new());
    next.stop_record = record;
    next.settle();
    next
}

fn used(h: &Harness) -> StopRecordUse {
    h.recovered.last().unwrap_or_else(|| panic!("not recovered: {:?} {:?}", h.stopped, h.held)).stop_record
}

#[test]
fn a_clean_stop_leaves_a_record_the_next_start_uses_instead_of_a_scan() {
    let first = run_then_stop(true);
    assert_eq!(first.stopped, Some(StopReason::Clean));
    let record = first.stop_record.clone().expect("a stop record is written");
    let with = restart(&first, Some(record), config());
    assert_eq!(used(&with), StopRecordUse::Used);
    assert!(with.reads.iter().all(|(asked, _)| *asked <= 4096), "only the checks' reads: {:?}", with.reads);
    let scanned = restart(&first, None, config());
    assert_eq!(used(&scanned), StopRecordUse::Absent);
    assert!(scanned.reads.iter().any(|(asked, _)| *asked > 4096), "a scan reads windows");
    assert_eq!(with.host.committed(), scanned.host.committed());
    assert_eq!(with.host.committed(), first.host.committed());
    assert_eq!(with.host.wal_head(), scanned.host.wal_head());
    assert_eq!(with.host.records_held(), (0, 0), "every record was acknowledged");
}

#[test]
fn a_drain_that_times_out_behind_a_lagging_sink_still_leaves_a_record_and_the_sink_gets_its_records() {
    let first = run_then_stop(false);
    assert_eq!(first.stopped, Some(StopReason::DrainTimedOut));
    let record = first.stop_record.clone().expect("the WAL was consistent: a stop record is written");
    let mut with = restart(&first, Some(record), config());
    assert_eq!(used(&with), StopRecordUse::Used);
    assert_eq!(with.host.records_held(), (4, 12), "the four records wait for the sink, only in the WAL");
    // The open compaction goes again, its records read back from the WAL.
    let (id, groups) = with.read_back();
    with.answer(id, Ok(IoReply::Groups(groups)));
    let (_, records) = with.sink_records();
    assert_eq!(records, (0..4u8).map(|p| vec![p; 3]).collect::<Vec<_>>());
}

#[test]
fn a_record_a_later_run_made_stale_is_set_aside_and_the_wal_scanned() {
    let first = run_then_stop(true);
    let record = first.stop_record.clone().expect("a stop record");
    // The next run uses it, commits more, and is killed: no new record.
    let mut second = restart(&first, Some(record.clone()), config());
    second.open_source();
    second.feed(4, 9);
    let third = restart(&second, Some(record.clone()), config());
    assert_eq!(used(&third), StopRecordUse::Stale("bytes were written after the WAL's end the record names"));
    let scanned = restart(&second, None, config());
    assert_eq!(third.host.committed(), scanned.host.committed());
    assert_eq!(third.host.committed().partitions.values().map(|p| p.position.0).collect::<Vec<_>>(), vec![9]);
    // The planted bug `trust-stale-stop-record` takes it as it is: back at
    // position 4, behind the offsets store (here that check stops it).
    let mut cfg = config();
    cfg.mutations = crate::Mutations::NONE.with(Mutation::TrustStaleStopRecord);
    let trusting = restart(&second, Some(record), cfg);
    let key = PartitionKey { source: SourceId(0), partition: 0 };
    assert_eq!(trusting.stopped, Some(StopReason::OffsetsAheadOfWal { key, store: Position(9), wal: Position(4) }));
}

#[test]
fn a_damaged_record_or_one_naming_other_segments_is_set_aside() {
    let first = run_then_stop(true);
    let mut record = first.stop_record.clone().expect("a stop record");
    let last = record.len() - 1;
    record[last] ^= 1;
    let damaged = restart(&first, Some(record), config());
    assert_eq!(used(&damaged), StopRecordUse::Stale("the stop record fails its checksum"));
    let mut more = first.disk.clone();
    let (&id, bytes) = more.iter().next_back().expect("a segment");
    let mut extra = bytes.clone();
    extra[..SEGMENT_HEADER_BYTES].copy_from_slice(&encode_header(SegmentId(id.0 + 1), Epoch(1)));
    more.insert(SegmentId(id.0 + 1), extra);
    let mut added = Harness::unsettled(config(), more, first.offsets.clone(), Vec::new());
    added.stop_record = first.stop_record.clone();
    added.settle();
    assert_eq!(used(&added), StopRecordUse::Stale("the WAL's segments are not the ones the stop record names"));
}

#[test]
fn a_sink_added_since_the_stop_sets_the_record_aside_and_gets_every_record_the_wal_holds() {
    // The one sink acknowledged everything, so the record holds no batch;
    // a sink added now needs all of them, which a scan finds.
    let first = run_then_stop(true);
    let mut cfg = config();
    cfg.sinks.push("late".into());
    let added = restart(&first, first.stop_record.clone(), cfg.clone());
    let why = "the configured sources, sinks or streams are not those of the run that wrote the stop record";
    assert_eq!(used(&added), StopRecordUse::Stale(why));
    let scanned = restart(&first, None, cfg);
    assert_eq!(added.host.records_held(), scanned.host.records_held());
    assert_eq!(added.host.records_held().0, 4, "the new sink's four records");
}

/// On an object store every check is a request: they are sent together
/// (within a bound of bytes), one per segment at a time (a segment's first
/// read lists its objects, the next ones read on from that listing).
#[test]
fn a_stop_records_checks_are_read_several_at_once_one_per_segment() {
    let first = run_then_stop(true);
    let mut h = Harness::unsettled(config(), first.disk.clone(), first.offsets.clone(), Vec::new());
    h.stop_record = first.stop_record.clone();
    let at_once = loop {
        while let Some(out) = h.host.poll_output() {
            if let Output::Io { id, op } = out {
                h.held.push((id, op));
            }
        }
        let reads: Vec<SegmentId> = h
            .held
            .iter()
            .filter_map(|(_, op)| match op {
                IoOp::Wal(WalOp::ReadAt { segment, .. }) => Some(*segment),
                _ => None,
            })
            .collect();
        if !reads.is_empty() {
            break reads;
        }
        let i = h.held.iter().position(|(_, op)| is_storage(op)).expect("recovery goes on");
        let (id, op) = h.held.remove(i);
        let result = h.perform(op);
        h.host.handle(h.now, Input::IoDone { id, result });
    };
    let segments: BTreeSet<SegmentId> = at_once.iter().copied().collect();
    assert!(at_once.len() >= 2, "the segment and a spare at once: {at_once:?}");
    assert_eq!(segments.len(), at_once.len(), "one read per segment at a time: {at_once:?}");
    h.settle();
    assert_eq!(used(&h), StopRecordUse::Used);
}
