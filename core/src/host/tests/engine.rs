//! The running engine: commits, acks, compactions, retries, shutdown.

use super::*;
use crate::io::{OffsetsOp, PluginOp, WalOp};

#[test]
fn a_fresh_wal_recovers_empty_and_opens_sources() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    assert!(h.open_source().is_empty());
    assert!(h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. }))));
    assert_eq!(h.disk.len(), 2, "the fence opened one segment and a spare is created ahead of need");
}

#[test]
fn a_source_is_acked_only_after_its_group_commits() {
    // Stepped by hand: the outputs that follow the batch at once hold the
    // append, but no ack and no offsets write.
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    let outputs = h.feed_unsettled(0, 5);
    assert!(outputs.iter().any(|o| matches!(o, Output::Io { op: IoOp::Wal(WalOp::Append { .. }), .. })));
    assert!(
        !outputs.iter().any(|o| matches!(
            o,
            Output::Io { op: IoOp::Plugin(PluginOp::SourceAck { .. }) | IoOp::Offsets(OffsetsOp::Write { .. }), .. }
        )),
        "nothing is acked or materialized before the commit completes"
    );
    // With the commit completed, the ack and the offsets write follow.
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 5);
    let (_, acks) = h.take(|op| match op {
        IoOp::Plugin(PluginOp::SourceAck { acks, .. }) => Some(acks.clone()),
        _ => None,
    });
    assert_eq!(acks, vec![(0, Position(5))]);
    let stored = OffsetValue::decode(&h.offsets[&key0()]).unwrap();
    assert_eq!((stored.position, stored.records), (Position(5), 5));
}

#[test]
fn records_below_the_committed_position_are_dropped() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 5);
    h.feed(3, 8);
    assert_eq!(h.committed_positions(), vec![0, 1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn compactions_dispatch_after_their_plan_commits_and_replay_with_the_same_id() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 4);
    let (_, id, seq, n) = h.sink_apply();
    assert_eq!((seq, n), (CompactionSeq(0), 4));
    // The plan is in the WAL: a restart replays it under the same id.
    let mut again = Harness::start(h.disk.clone(), h.offsets.clone());
    let (replay, id2, seq2, n2) = again.sink_apply();
    assert_eq!((id2, seq2, n2), (id, seq, n));
    // Once done is committed, the next restart does not replay it.
    again.answer(replay, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 4 }));
    let third = Harness::start(again.disk.clone(), again.offsets.clone());
    assert!(!third.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))));
}

#[test]
fn offsets_ahead_of_the_wal_stop_recovery() {
    let value = OffsetValue { position: Position(10), lsn: Lsn(3), records: 10 };
    let offsets = BTreeMap::from([(key0(), value.encode().to_vec())]);
    let h = Harness::start(BTreeMap::new(), offsets);
    assert_eq!(h.stopped, Some(StopReason::OffsetsAheadOfWal { key: key0(), store: Position(10), wal: Position(0) }));
}

#[test]
fn an_ambiguous_append_is_retried_with_identical_bytes() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    let (id, _, bytes) = the_append(h.feed_unsettled(0, 1));
    h.host.handle(h.now, Input::IoDone { id, result: Err(IoError::Ambiguous) });
    let appended_at_once = std::iter::from_fn(|| h.host.poll_output())
        .any(|o| matches!(o, Output::Io { op: IoOp::Wal(WalOp::Append { .. }), .. }));
    assert!(!appended_at_once, "the retry waits for its backoff");
    let (at, timer) = h.host.poll_timeout().unwrap();
    assert_eq!(timer, Timer::Retry);
    h.now = at;
    h.host.handle(at, Input::Timeout);
    let retry = std::iter::from_fn(|| h.host.poll_output())
        .find_map(|o| match o {
            Output::Io { op: IoOp::Wal(WalOp::Append { bytes, .. }), .. } => Some(bytes),
            _ => None,
        })
        .expect("the append is sent again");
    assert_eq!(retry, bytes);
}

#[test]
fn a_failed_append_stops_the_engine_for_recovery_to_decide() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    let (id, segment, _) = the_append(h.feed_unsettled(0, 1));
    h.host.handle(h.now, Input::IoDone { id, result: Err(IoError::Failed) });
    let stop = std::iter::from_fn(|| h.host.poll_output()).last();
    assert!(matches!(stop, Some(Output::Stopped(StopReason::WalWriteFailed { segment: s, .. })) if s == segment));
}

#[test]
fn a_failed_ack_is_sent_again() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 3);
    let (id, _) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceAck { .. })).then_some(()));
    h.answer(id, Err(IoError::Failed));
    let (at, _) = h.host.poll_timeout().unwrap();
    h.now = at;
    h.host.handle(at, Input::Timeout);
    h.settle();
    let (_, acks) = h.take(|op| match op {
        IoOp::Plugin(PluginOp::SourceAck { acks, .. }) => Some(acks.clone()),
        _ => None,
    });
    assert_eq!(acks, vec![(0, Position(3))]);
}

#[test]
fn shutdown_drains_then_stops_clean() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 4);
    assert!(!h.host.is_draining());
    h.host.handle(h.now, Input::Shutdown);
    h.settle();
    assert_eq!(h.stopped, None, "a compaction is still out");
    assert!(h.host.is_draining() && !h.host.is_recovering());
    let (ack, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceAck { .. })).then_some(()));
    h.answer(ack, Ok(IoReply::Done));
    let (apply, ..) = h.sink_apply();
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 4 }));
    assert_eq!(h.stopped, None, "the read issued before the shutdown is still out");
    let (read, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    h.answer(read, Ok(IoReply::Batches { batches: vec![], exhausted: false }));
    assert_eq!(h.stopped, Some(StopReason::Clean));
    assert!(!h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. }))), "no new source read while draining");
}

#[test]
#[should_panic(expected = "poll_output was not drained")]
fn handle_asserts_the_output_queue_was_drained() {
    let mut host = Host::new(config(), Instant::ZERO).unwrap();
    host.handle(Instant::ZERO, Input::Timeout);
}

#[test]
fn a_bad_configuration_is_an_error_at_construction() {
    let mut c = config();
    c.limits.segment_bytes = 4096;
    let err = Host::new(c, Instant::ZERO).err().unwrap();
    assert!(err.0.contains("segment size 4096 is too small"), "{err}");
}

#[test]
fn a_fatal_sink_answer_stops_the_engine_loudly() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 2);
    let (apply, id, ..) = h.sink_apply();
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Fatal, rows: 0 }));
    let seq = CompactionSeq(0);
    assert_eq!(h.stopped, Some(StopReason::SinkFatal { sink: SinkId(0), stream: StreamId(0), id, seq }));
}

#[test]
fn a_retryable_sink_answer_retries_the_same_batch() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 2);
    let (apply, id, seq, n) = h.sink_apply();
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Retryable, rows: 0 }));
    let (at, _) = h.host.poll_timeout().unwrap();
    h.now = at;
    h.host.handle(at, Input::Timeout);
    h.settle();
    let (_, id2, seq2, n2) = h.sink_apply();
    assert_eq!((id2, seq2, n2), (id, seq, n));
}

#[test]
fn a_source_that_refuses_to_go_on_stops_the_engine_with_its_reason() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    let (id, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    h.answer(id, Ok(IoReply::SourceRefused { why: "raise the limit".into() }));
    assert_eq!(h.stopped, Some(StopReason::SourceRefused { source: SourceId(0), why: "raise the limit".into() }));
}

#[test]
fn a_source_breaking_position_order_stops_with_a_protocol_error() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    let (id, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    let records =
        vec![Record { position: Position(5), bytes: vec![1] }, Record { position: Position(4), bytes: vec![2] }];
    let batch = SourceBatchIn {
        partition: 0,
        stream: StreamId(0),
        records,
        end: Position(6),
        checkpoint: None,
        schema: None,
        faults: Vec::new(),
        window: Window::None,
        keys: Vec::new(),
    };
    h.answer(id, Ok(IoReply::Batches { batches: vec![batch], exhausted: false }));
    assert!(matches!(h.stopped, Some(StopReason::SourceProtocol { partition: 0, .. })), "{:?}", h.stopped);
}

#[test]
fn a_record_breaking_an_intake_rule_stops_the_daemon_before_anything_of_its_read_is_taken_in() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    let (id, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    let record = |p: u64, bytes: &[u8]| Record { position: Position(p), bytes: bytes.to_vec() };
    let batch = |partition: u32, records: Vec<Record>, faults: Vec<IntakeFault>| SourceBatchIn {
        partition,
        stream: StreamId(0),
        records,
        end: Position(2),
        checkpoint: None,
        schema: None,
        faults,
        window: Window::None,
        keys: Vec::new(),
    };
    let good = batch(0, vec![record(0, b"1"), record(1, b"2")], Vec::new());
    let why = "line 2 of a.jsonl: fix it".to_string();
    let fault = IntakeFault { position: Position(1), fault: RecordFault::NotJson("EOF".into()), why };
    let bad = batch(1, vec![record(0, b"3"), record(1, b"{")], vec![fault]);
    h.answer(id, Ok(IoReply::Batches { batches: vec![good, bad], exhausted: false }));
    let why = "line 2 of a.jsonl: fix it".to_string();
    assert_eq!(h.stopped, Some(StopReason::SourceRefused { source: SourceId(0), why }));
    let appended = h.held.iter().any(|(_, op)| matches!(op, IoOp::Wal(WalOp::Append { .. })));
    assert!(!appended, "nothing of the read, not even the good batch before it, goes to the WAL");
}

#[test]
fn a_malformed_offsets_value_stops_recovery_naming_the_key() {
    let offsets = BTreeMap::from([(key0(), vec![0u8; 23])]);
    let h = Harness::start(BTreeMap::new(), offsets);
    assert_eq!(h.stopped, Some(StopReason::OffsetsMalformed { key: key0(), len: 23 }));
}

#[test]
fn with_stop_when_exhausted_the_engine_drains_once_every_source_is_done() {
    let mut cfg = config();
    cfg.stop_when_exhausted = true;
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.host = Host::new(cfg, Instant::ZERO).unwrap();
    h.held.clear();
    h.settle();
    h.open_source();
    let (id, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    let records = vec![Record { position: Position(0), bytes: b"only".to_vec() }];
    let batch = SourceBatchIn {
        partition: 0,
        stream: StreamId(0),
        records,
        end: Position(1),
        checkpoint: None,
        schema: None,
        faults: Vec::new(),
        window: Window::None,
        keys: Vec::new(),
    };
    h.answer(id, Ok(IoReply::Batches { batches: vec![batch], exhausted: true }));
    let (ack, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceAck { .. })).then_some(()));
    h.answer(ack, Ok(IoReply::Done));
    assert_eq!(h.stopped, None);
    let (apply, ..) = h.sink_apply();
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 1 }));
    assert_eq!(h.stopped, Some(StopReason::Clean));
}

#[test]
fn the_next_deadline_is_the_earliest_and_a_tie_keeps_the_first_reason() {
    let t = Instant::from_micros;
    let four = [Some((t(9), Timer::Retry)), Some((t(3), Timer::SegmentAge)), None, Some((t(5), Timer::Stall))];
    assert_eq!(crate::host::earliest(four), Some((t(3), Timer::SegmentAge)));
    assert_eq!(
        crate::host::earliest([Some((t(4), Timer::Lease)), Some((t(4), Timer::Drain))]),
        Some((t(4), Timer::Lease))
    );
    assert_eq!(crate::host::earliest::<2>([None, None]), None);
}
