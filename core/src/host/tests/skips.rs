//! An operator's skip (`run --skip-input`): recorded in the WAL before any
//! source opens, the records in its span dropped wherever they arrive, and
//! a partition that stands at its start moved on past it, sinks included.

use super::*;
use crate::config::SkipRequest;
use crate::io::PluginOp;
use crate::wal::Skipped;

fn with_skip(at: u64, next: u64) -> HostConfig {
    let skip = SkipRequest {
        key: key0(),
        stream: StreamId(0),
        at: Position(at),
        next: Position(next),
        reason: "bad export".into(),
    };
    HostConfig { skips: vec![skip], ..config() }
}

/// Every skip the WAL holds, as (at, next).
fn skips_in_wal(h: &Harness) -> Vec<(u64, u64)> {
    let files: Vec<(SegmentId, &[u8])> = h.disk.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    let frames = scan(&files, false).unwrap().into_iter().flat_map(|s| s.groups).flat_map(|g| g.frames);
    frames
        .filter_map(|f| if let Frame::Skipped(Skipped { at, next, .. }) = f { Some((at.0, next.0)) } else { None })
        .collect()
}

fn skips_opened(h: &mut Harness) -> Vec<(u32, Position, Position)> {
    let (id, skips) = h.take(|op| match op {
        IoOp::Plugin(PluginOp::SourceOpen { skips, .. }) => Some(skips.clone()),
        _ => None,
    });
    h.answer(id, Ok(IoReply::Done));
    skips
}

/// Five records committed and delivered.
fn five_delivered() -> Harness {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 5);
    let (id, ..) = h.sink_apply();
    h.answer(id, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 5 }));
    h
}

#[test]
fn a_skip_where_the_partition_stands_drops_that_record_and_moves_on() {
    let h = five_delivered();
    let mut h = Harness::start_full(with_skip(5, 6), h.disk.clone(), h.offsets.clone(), Vec::new());
    assert_eq!(h.skips, vec![true]);
    assert_eq!(skips_opened(&mut h), vec![(0, Position(5), Position(6))]);
    // The source sends the refused record again, and more after it.
    h.feed(5, 9);
    assert_eq!(h.committed_positions(), vec![0, 1, 2, 3, 4, 6, 7, 8]);
    assert_eq!(skips_in_wal(&h), vec![(5, 6)]);
    let (_, records) = h.sink_records();
    assert_eq!(records, vec![vec![6u8; 3], vec![7u8; 3], vec![8u8; 3]]);
}

#[test]
fn a_skip_of_the_last_input_moves_the_partition_and_its_sinks_on_by_itself() {
    let h = five_delivered();
    let h = Harness::start_full(with_skip(5, 6), h.disk.clone(), h.offsets.clone(), Vec::new());
    // Nothing follows the skipped record: the skip's commit alone moves
    // the position, the offsets store and the sink's delivered position.
    let stored = OffsetValue::decode(&h.offsets[&key0()]).unwrap();
    assert_eq!((stored.position, stored.records), (Position(6), 5));
    let committed = h.host.committed();
    assert_eq!(committed.partitions[&key0()].position, Position(6));
    assert_eq!(committed.acked(SinkId(0), key0()), Position(6), "nothing is left to deliver");
    // A start without the option resumes after it, and one with it again
    // finds it done.
    let mut plain = Harness::start(h.disk.clone(), h.offsets.clone());
    assert_eq!(plain.open_source()[0].position, Position(6));
    let again = Harness::start_full(with_skip(5, 6), h.disk.clone(), h.offsets.clone(), Vec::new());
    assert_eq!(again.skips, vec![false]);
    assert_eq!(skips_in_wal(&again), vec![(5, 6)], "done once, recorded once");
}

#[test]
fn a_skip_inside_a_read_drops_only_its_record() {
    let mut h = Harness::start_full(with_skip(2, 3), BTreeMap::new(), BTreeMap::new(), Vec::new());
    assert_eq!(h.skips, vec![true]);
    skips_opened(&mut h);
    h.feed(0, 5);
    assert_eq!(h.committed_positions(), vec![0, 1, 3, 4]);
}

#[test]
fn a_read_of_nothing_but_the_skipped_record_still_passes_it() {
    // Committed up to 2 after the skip was recorded at 0 (so it did not
    // move the partition): a read holding only record 2 moves it to 3.
    let mut h = Harness::start_full(with_skip(2, 3), BTreeMap::new(), BTreeMap::new(), Vec::new());
    skips_opened(&mut h);
    h.feed(0, 2);
    h.feed(2, 3);
    assert_eq!(h.committed_positions(), vec![0, 1]);
    assert_eq!(skips_in_wal(&h), vec![(2, 3), (2, 3)], "committed again where the partition stands");
    let mut plain = Harness::start(h.disk.clone(), h.offsets.clone());
    assert_eq!(plain.open_source()[0].position, Position(3));
}

#[test]
fn a_skip_of_committed_input_is_refused_and_one_already_passed_does_nothing() {
    let h = five_delivered();
    let across = Harness::start_full(with_skip(3, 7), h.disk.clone(), h.offsets.clone(), Vec::new());
    assert!(
        matches!(across.stopped, Some(StopReason::SkipNotNext { position: Position(5), .. })),
        "{:?}",
        across.stopped
    );
    assert!(skips_in_wal(&across).is_empty());
    let mut behind = Harness::start_full(with_skip(2, 4), h.disk.clone(), h.offsets.clone(), Vec::new());
    assert_eq!(behind.skips, vec![false]);
    assert!(skips_opened(&mut behind).is_empty());
    assert!(skips_in_wal(&behind).is_empty());
}
