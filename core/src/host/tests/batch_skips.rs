//! An operator's batch skip (`run --skip-batch`): an open plan its sink
//! will not take is given up at recovery, recorded in the WAL, never sent
//! again; its records go nowhere and the next batch follows under the next
//! number. Given again, it is a no-op; a batch not yet planned, or settled
//! with dead letters to deliver, is refused with nothing given up.

use super::*;
use crate::config::BatchSkipRequest;
use crate::wal::BatchSkipped;

fn with_batch_skip(seq: u64) -> HostConfig {
    let skip = BatchSkipRequest { sink: SinkId(0), stream: StreamId(0), seq: CompactionSeq(seq), reason: "bad".into() };
    HostConfig { batch_skips: vec![skip], ..config() }
}

/// Every batch skip the WAL holds, as (seq, reason).
fn batch_skips_in_wal(h: &Harness) -> Vec<(u64, String)> {
    let files: Vec<(SegmentId, &[u8])> = h.disk.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    let frames = scan(&files, false).unwrap().into_iter().flat_map(|s| s.groups).flat_map(|g| g.frames);
    frames
        .filter_map(|f| match f {
            Frame::BatchSkipped(BatchSkipped { seq, reason, .. }) => Some((seq.0, reason)),
            _ => None,
        })
        .collect()
}

/// Five records committed; the sink answered `fatal` for their batch.
fn five_refused_as_fatal() -> Harness {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 5);
    let (apply, id, seq, _) = h.sink_apply();
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Fatal, rows: 0 }));
    assert_eq!(h.stopped, Some(StopReason::SinkFatal { sink: SinkId(0), stream: StreamId(0), id, seq }));
    h
}

#[test]
fn a_batch_skip_gives_up_the_open_plan_and_the_next_batch_follows_under_the_next_number() {
    let h = five_refused_as_fatal();
    // Without the option the same batch is sent again, with its id.
    let mut plain = Harness::start(h.disk.clone(), h.offsets.clone());
    assert_eq!(plain.sink_apply().2, CompactionSeq(0));
    let mut h = Harness::start_full(with_batch_skip(0), h.disk.clone(), h.offsets.clone(), Vec::new());
    assert_eq!(h.skips, vec![true]);
    assert!(!h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))), "the batch is not sent again");
    assert_eq!(batch_skips_in_wal(&h), vec![(0, "bad".to_string())]);
    let committed = h.host.committed();
    assert!(committed.open.is_empty());
    assert_eq!(committed.acked(SinkId(0), key0()), Position(5), "its records count as delivered nowhere");
    // The next records go out as batch 1, without the given-up ones.
    h.open_source();
    h.feed(5, 7);
    let (_, records) = h.sink_records();
    assert_eq!(records, vec![vec![5u8; 3], vec![6u8; 3]]);
    // Given again, the skip finds the batch done: nothing more is recorded.
    let again = Harness::start_full(with_batch_skip(0), h.disk.clone(), h.offsets.clone(), Vec::new());
    assert_eq!(again.skips, vec![false]);
    assert_eq!(again.stopped, None);
    assert_eq!(batch_skips_in_wal(&again), vec![(0, "bad".to_string())], "done once, recorded once");
}

#[test]
fn a_batch_skip_names_the_next_number_after_one_given_up() {
    let h = five_refused_as_fatal();
    let mut h = Harness::start_full(with_batch_skip(0), h.disk.clone(), h.offsets.clone(), Vec::new());
    h.open_source();
    h.feed(5, 7);
    let (apply, _, seq, _) = h.sink_apply();
    assert_eq!(seq, CompactionSeq(1));
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 2 }));
    assert_eq!(h.host.committed().next_seq[&(SinkId(0), StreamId(0))], CompactionSeq(2));
}

#[test]
fn a_batch_not_yet_planned_cannot_be_given_up() {
    let h = five_refused_as_fatal();
    let h = Harness::start_full(with_batch_skip(3), h.disk.clone(), h.offsets.clone(), Vec::new());
    let want = StopReason::BatchSkipNotOpen {
        sink: SinkId(0),
        stream: StreamId(0),
        seq: CompactionSeq(3),
        next: CompactionSeq(1),
        settled: false,
    };
    assert_eq!(h.stopped, Some(want));
    assert!(batch_skips_in_wal(&h).is_empty(), "nothing given up");
    assert_eq!(h.host.committed().open.len(), 1, "the open plan stays");
}

#[test]
fn a_settled_batch_whose_dead_letters_are_not_delivered_cannot_be_given_up() {
    use crate::config::DeadLetters;
    use crate::io::RefusedIndex;
    let letters = HostConfig { dead_letters: Some(DeadLetters { max: 100, window: 1_000 }), ..config() };
    let mut h = Harness::start_full(letters.clone(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 4);
    let (apply, ..) = h.sink_apply();
    let refused = vec![RefusedIndex { index: 1, reason: "bad".into() }];
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Refused(refused), rows: 0 }));
    let (apply, ..) = h.sink_apply();
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 3 }));
    // Settled; its dead letters are out, and never answered.
    assert!(h.has(|op| matches!(op, IoOp::Plugin(PluginOp::DeadLetters(_)))));
    let skip = BatchSkipRequest { sink: SinkId(0), stream: StreamId(0), seq: CompactionSeq(0), reason: "x".into() };
    let cfg = HostConfig { batch_skips: vec![skip], ..letters };
    let h = Harness::start_full(cfg, h.disk.clone(), h.offsets.clone(), Vec::new());
    let want = StopReason::BatchSkipNotOpen {
        sink: SinkId(0),
        stream: StreamId(0),
        seq: CompactionSeq(0),
        next: CompactionSeq(1),
        settled: true,
    };
    assert_eq!(h.stopped, Some(want));
    assert!(batch_skips_in_wal(&h).is_empty(), "nothing given up");
}
