//! Named scenarios: the engine stepped by hand against an in-memory disk and
//! offsets store, one rule of the contract per test.

use super::*;
use crate::config::Limits;
use crate::wal::{scan, Frame};

fn config() -> HostConfig {
    HostConfig {
        seed: 1,
        sources: vec!["src".into()],
        sinks: vec!["sink".into()],
        streams: vec!["orders".into()],
        limits: Limits {
            segment_bytes: 64 * 1024,
            group_bytes_max: 4096,
            pending_bytes_max: 8192,
            ..Limits::default()
        },
        stop_when_exhausted: false,
        schema_plugin: false,
        lease: None,
        mutations: crate::Mutations::NONE,
    }
}

/// An engine with a disk and an offsets store that answer at once, and every
/// other request held for the test to answer.
struct Harness {
    host: Host,
    now: Instant,
    disk: BTreeMap<SegmentId, Vec<u8>>,
    offsets: BTreeMap<PartitionKey, Vec<u8>>,
    held: Vec<(IoId, IoOp)>,
    stopped: Option<StopReason>,
    /// What the sink answers when recovery asks for its progress.
    sink_progress: Vec<(StreamId, CompactionSeq)>,
}

impl Harness {
    fn start(disk: BTreeMap<SegmentId, Vec<u8>>, offsets: BTreeMap<PartitionKey, Vec<u8>>) -> Harness {
        Harness::start_full(config(), disk, offsets, Vec::new())
    }

    fn start_full(
        cfg: HostConfig,
        disk: BTreeMap<SegmentId, Vec<u8>>,
        offsets: BTreeMap<PartitionKey, Vec<u8>>,
        sink_progress: Vec<(StreamId, CompactionSeq)>,
    ) -> Harness {
        let host = Host::new(cfg, Instant::ZERO).unwrap();
        let held = Vec::new();
        let mut h = Harness { host, now: Instant::ZERO, disk, offsets, held, stopped: None, sink_progress };
        h.settle();
        h
    }

    /// Drains outputs, performing WAL and offsets requests until none is left.
    fn settle(&mut self) {
        loop {
            while let Some(out) = self.host.poll_output() {
                match out {
                    Output::Io { id, op } => self.held.push((id, op)),
                    Output::Stopped(reason) => self.stopped = Some(reason),
                    Output::Recovered(_) | Output::LeaseWait { .. } | Output::Stalled { .. } | Output::Unstalled => {}
                }
            }
            let Some(i) = self.held.iter().position(|(_, op)| is_storage(op)) else {
                return;
            };
            let (id, op) = self.held.remove(i);
            let result = self.perform(op);
            self.host.handle(self.now, Input::IoDone { id, result });
        }
    }

    fn perform(&mut self, op: IoOp) -> Result<IoReply, IoError> {
        Ok(match op {
            IoOp::WalSync => IoReply::Done,
            IoOp::WalList => IoReply::Segments(self.disk.keys().copied().collect()),
            IoOp::WalRead { segment } => IoReply::SegmentBytes(self.disk[&segment].clone()),
            IoOp::WalCreate { segment, header } => {
                let mut file = vec![0; config().limits.segment_bytes as usize];
                file[..header.len()].copy_from_slice(&header);
                self.disk.insert(segment, file);
                IoReply::Done
            }
            IoOp::WalAppend { segment, offset, bytes, .. } => {
                let file = self.disk.get_mut(&segment).unwrap();
                file[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
                IoReply::Done
            }
            IoOp::WalDelete { segment } => {
                self.disk.remove(&segment);
                IoReply::Done
            }
            IoOp::OffsetsRead => IoReply::Offsets(self.offsets.iter().map(|(k, v)| (*k, v.clone(), None)).collect()),
            IoOp::OffsetsWrite { entries } => {
                for e in entries {
                    self.offsets.insert(e.key, e.value.encode().to_vec());
                }
                IoReply::Done
            }
            // The harness's sink keeps no progress of its own: it answers
            // that it cannot tell; `sink_progress` tests set an answer.
            IoOp::SinkProgress { .. } => IoReply::SinkProgress(self.sink_progress.clone()),
            other => unreachable!("not a storage request: {other:?}"),
        })
    }

    /// Removes and returns the first held request that `pick` accepts.
    fn take<T>(&mut self, pick: impl Fn(&IoOp) -> Option<T>) -> (IoId, T) {
        let i = self.held.iter().position(|(_, op)| pick(op).is_some()).unwrap_or_else(|| {
            panic!("no such request among {:?}", self.held.iter().map(|(_, op)| op).collect::<Vec<_>>())
        });
        let (id, op) = self.held.remove(i);
        (id, pick(&op).unwrap())
    }

    fn has(&self, pick: impl Fn(&IoOp) -> bool) -> bool {
        self.held.iter().any(|(_, op)| pick(op))
    }

    fn answer(&mut self, id: IoId, result: Result<IoReply, IoError>) {
        self.host.handle(self.now, Input::IoDone { id, result });
        self.settle();
    }

    fn open_source(&mut self) -> Vec<ResumePoint> {
        let (id, resume) = self.take(|op| match op {
            IoOp::SourceOpen { resume, .. } => Some(resume.clone()),
            _ => None,
        });
        self.answer(id, Ok(IoReply::Done));
        resume
    }

    /// Answers the source's read with records `from..to` of partition 0 and
    /// returns the outputs that follow at once, without performing any.
    fn feed_unsettled(&mut self, from: u64, to: u64) -> Vec<Output> {
        let (id, ()) = self.take(|op| matches!(op, IoOp::SourceRead { .. }).then_some(()));
        let result = Ok(IoReply::Batches { batches: vec![batch(from, to)], exhausted: false });
        self.host.handle(self.now, Input::IoDone { id, result });
        std::iter::from_fn(|| self.host.poll_output()).collect()
    }

    /// Answers the source's read with records `from..to` of partition 0.
    fn feed(&mut self, from: u64, to: u64) {
        let (id, ()) = self.take(|op| matches!(op, IoOp::SourceRead { .. }).then_some(()));
        self.answer(id, Ok(IoReply::Batches { batches: vec![batch(from, to)], exhausted: false }));
    }

    /// Positions of the records each committed source-batch frame holds.
    fn committed_positions(&self) -> Vec<u64> {
        let files: Vec<(SegmentId, &[u8])> = self.disk.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let mut out = Vec::new();
        for seg in scan(&files, false).unwrap() {
            for g in seg.groups {
                for f in g.frames {
                    if let Frame::SourceBatch(b) = f {
                        out.extend(b.records.iter().map(|r| r.position.0));
                    }
                }
            }
        }
        out
    }

    fn sink_apply(&mut self) -> (IoId, CompactionId, CompactionSeq, usize) {
        let (id, (cid, seq, n)) = self.take(|op| match op {
            IoOp::SinkApply(a) => Some((a.id, a.seq, a.records.len())),
            _ => None,
        });
        (id, cid, seq, n)
    }
}

/// Records `from..to` of partition 0, three bytes each.
fn batch(from: u64, to: u64) -> SourceBatchIn {
    let records = (from..to).map(|p| Record { position: Position(p), bytes: vec![p as u8; 3] }).collect();
    SourceBatchIn { partition: 0, stream: StreamId(0), records, end: Position(to), checkpoint: None, schema: None }
}

/// The append among `outputs`: its id, segment and bytes.
fn the_append(outputs: Vec<Output>) -> (IoId, SegmentId, Arc<Vec<u8>>) {
    outputs
        .into_iter()
        .find_map(|o| match o {
            Output::Io { id, op: IoOp::WalAppend { segment, bytes, .. } } => Some((id, segment, bytes)),
            _ => None,
        })
        .expect("an append")
}

fn is_storage(op: &IoOp) -> bool {
    matches!(
        op,
        IoOp::WalSync
            | IoOp::WalList
            | IoOp::WalRead { .. }
            | IoOp::WalCreate { .. }
            | IoOp::WalAppend { .. }
            | IoOp::WalDelete { .. }
            | IoOp::OffsetsRead
            | IoOp::OffsetsWrite { .. }
            | IoOp::SinkProgress { .. }
    )
}

fn key0() -> PartitionKey {
    PartitionKey { source: SourceId(0), partition: 0 }
}

#[test]
fn a_fresh_wal_recovers_empty_and_opens_sources() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    assert!(h.open_source().is_empty());
    assert!(h.has(|op| matches!(op, IoOp::SourceRead { .. })));
    assert_eq!(h.disk.len(), 2, "the fence opened one segment and a spare is created ahead of need");
}

#[test]
fn a_source_is_acked_only_after_its_group_commits() {
    // Stepped by hand: the outputs that follow the batch at once hold the
    // append, but no ack and no offsets write.
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    let outputs = h.feed_unsettled(0, 5);
    assert!(outputs.iter().any(|o| matches!(o, Output::Io { op: IoOp::WalAppend { .. }, .. })));
    assert!(
        !outputs.iter().any(|o| matches!(o, Output::Io { op: IoOp::SourceAck { .. } | IoOp::OffsetsWrite { .. }, .. })),
        "nothing is acked or materialized before the commit completes"
    );
    // With the commit completed, the ack and the offsets write follow.
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 5);
    let (_, acks) = h.take(|op| match op {
        IoOp::SourceAck { acks, .. } => Some(acks.clone()),
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
    assert!(!third.has(|op| matches!(op, IoOp::SinkApply(_))));
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
    let appended_at_once =
        std::iter::from_fn(|| h.host.poll_output()).any(|o| matches!(o, Output::Io { op: IoOp::WalAppend { .. }, .. }));
    assert!(!appended_at_once, "the retry waits for its backoff");
    let (at, timer) = h.host.poll_timeout().unwrap();
    assert_eq!(timer, Timer::Retry);
    h.now = at;
    h.host.handle(at, Input::Timeout);
    let retry = std::iter::from_fn(|| h.host.poll_output())
        .find_map(|o| match o {
            Output::Io { op: IoOp::WalAppend { bytes, .. }, .. } => Some(bytes),
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
    let (id, _) = h.take(|op| matches!(op, IoOp::SourceAck { .. }).then_some(()));
    h.answer(id, Err(IoError::Failed));
    let (at, _) = h.host.poll_timeout().unwrap();
    h.now = at;
    h.host.handle(at, Input::Timeout);
    h.settle();
    let (_, acks) = h.take(|op| match op {
        IoOp::SourceAck { acks, .. } => Some(acks.clone()),
        _ => None,
    });
    assert_eq!(acks, vec![(0, Position(3))]);
}

#[test]
fn shutdown_drains_then_stops_clean() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 4);
    h.host.handle(h.now, Input::Shutdown);
    h.settle();
    assert_eq!(h.stopped, None, "a compaction is still out");
    let (ack, ()) = h.take(|op| matches!(op, IoOp::SourceAck { .. }).then_some(()));
    h.answer(ack, Ok(IoReply::Done));
    let (apply, ..) = h.sink_apply();
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 4 }));
    assert_eq!(h.stopped, None, "the read issued before the shutdown is still out");
    let (read, ()) = h.take(|op| matches!(op, IoOp::SourceRead { .. }).then_some(()));
    h.answer(read, Ok(IoReply::Batches { batches: vec![], exhausted: false }));
    assert_eq!(h.stopped, Some(StopReason::Clean));
    assert!(!h.has(|op| matches!(op, IoOp::SourceRead { .. })), "no new source read while draining");
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
    assert_eq!(h.stopped, Some(StopReason::SinkFatal { sink: SinkId(0), stream: StreamId(0), id }));
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
fn a_source_breaking_position_order_stops_with_a_protocol_error() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    let (id, ()) = h.take(|op| matches!(op, IoOp::SourceRead { .. }).then_some(()));
    let records =
        vec![Record { position: Position(5), bytes: vec![1] }, Record { position: Position(4), bytes: vec![2] }];
    let batch =
        SourceBatchIn { partition: 0, stream: StreamId(0), records, end: Position(6), checkpoint: None, schema: None };
    h.answer(id, Ok(IoReply::Batches { batches: vec![batch], exhausted: false }));
    assert!(matches!(h.stopped, Some(StopReason::SourceProtocol { partition: 0, .. })), "{:?}", h.stopped);
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
    let (id, ()) = h.take(|op| matches!(op, IoOp::SourceRead { .. }).then_some(()));
    let records = vec![Record { position: Position(0), bytes: b"only".to_vec() }];
    let batch =
        SourceBatchIn { partition: 0, stream: StreamId(0), records, end: Position(1), checkpoint: None, schema: None };
    h.answer(id, Ok(IoReply::Batches { batches: vec![batch], exhausted: true }));
    let (ack, ()) = h.take(|op| matches!(op, IoOp::SourceAck { .. }).then_some(()));
    h.answer(ack, Ok(IoReply::Done));
    assert_eq!(h.stopped, None);
    let (apply, ..) = h.sink_apply();
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 1 }));
    assert_eq!(h.stopped, Some(StopReason::Clean));
}

fn schema_config() -> HostConfig {
    HostConfig { schema_plugin: true, ..config() }
}

fn batch_with_schema(from: u64, to: u64, schema: &str) -> SourceBatchIn {
    let records = (from..to).map(|p| Record { position: Position(p), bytes: vec![p as u8] }).collect();
    let schema = Some(Arc::from(schema.as_bytes()));
    SourceBatchIn { partition: 0, stream: StreamId(0), records, end: Position(to), checkpoint: None, schema }
}

impl Harness {
    fn start_with(cfg: HostConfig, disk: BTreeMap<SegmentId, Vec<u8>>) -> Harness {
        Harness::start_full(cfg, disk, BTreeMap::new(), Vec::new())
    }

    fn read_with(&mut self, batch: SourceBatchIn) {
        let (id, ()) = self.take(|op| matches!(op, IoOp::SourceRead { .. }).then_some(()));
        self.answer(id, Ok(IoReply::Batches { batches: vec![batch], exhausted: false }));
    }
}

#[test]
fn a_new_schema_is_decided_and_committed_before_its_records_and_never_asked_again() {
    let mut h = Harness::start_with(schema_config(), BTreeMap::new());
    h.open_source();
    h.read_with(batch_with_schema(0, 3, r#"{"v":1}"#));
    assert!(h.committed_positions().is_empty(), "nothing is committed before the decision");
    let (ask, stream) = h.take(|op| match op {
        IoOp::SchemaDecide { stream, .. } => Some(*stream),
        _ => None,
    });
    assert_eq!(stream, StreamId(0));
    assert!(!h.has(|op| matches!(op, IoOp::SourceRead { .. })), "the source waits for the decision");
    h.answer(ask, Ok(IoReply::Schema { accept: true, reason: String::new() }));
    assert_eq!(h.committed_positions(), vec![0, 1, 2]);
    // Restarted, the source sends the same schema again: no new question.
    let mut again = Harness::start_with(schema_config(), h.disk.clone());
    again.open_source();
    again.read_with(batch_with_schema(3, 5, r#"{"v":1}"#));
    assert!(!again.has(|op| matches!(op, IoOp::SchemaDecide { .. })), "a committed decision is not asked again");
    assert_eq!(again.committed_positions(), vec![0, 1, 2, 3, 4]);
    // A new schema is asked about; a refusal stops the engine.
    again.read_with(batch_with_schema(5, 6, r#"{"v":2}"#));
    let (ask, ()) = again.take(|op| matches!(op, IoOp::SchemaDecide { .. }).then_some(()));
    again.answer(ask, Ok(IoReply::Schema { accept: false, reason: "v2 drops a column".into() }));
    assert!(matches!(&again.stopped, Some(StopReason::SchemaRejected { reason, .. }) if reason == "v2 drops a column"));
    assert_eq!(again.committed_positions(), vec![0, 1, 2, 3, 4], "nothing under the refused schema");
}

#[test]
fn a_checkpoint_larger_than_a_group_is_a_protocol_error_not_a_stuck_wal() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    let (id, ()) = h.take(|op| matches!(op, IoOp::SourceRead { .. }).then_some(()));
    let records = vec![Record { position: Position(0), bytes: vec![1] }];
    let checkpoint = Some(vec![b'c'; 5000]);
    let batch =
        SourceBatchIn { partition: 0, stream: StreamId(0), records, end: Position(1), checkpoint, schema: None };
    h.answer(id, Ok(IoReply::Batches { batches: vec![batch], exhausted: false }));
    assert!(
        matches!(
            h.stopped,
            Some(StopReason::SourceProtocol { what: "a checkpoint is larger than a commit group allows", .. })
        ),
        "{:?}",
        h.stopped
    );
}

#[test]
fn a_smaller_segment_size_after_a_restart_seals_the_old_segment_and_goes_on() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    let mut next = 0;
    while h.host.wal_head().1.is_none_or(|(_, offset)| offset < 30_000) {
        h.feed(next, next + 200);
        next += 200;
    }
    let mut small = config();
    small.limits.segment_bytes = 20_000;
    let mut again = Harness::start_with(small, h.disk.clone());
    again.open_source();
    again.feed(next, next + 10);
    let committed = again.committed_positions();
    assert_eq!(committed.len() as u64, next + 10, "the new records are committed");
    assert_eq!(again.stopped, None);
    let files: Vec<(SegmentId, &[u8])> = again.disk.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    let segs = scan(&files, false).unwrap();
    let with_data: Vec<_> = segs.iter().filter(|s| !s.groups.is_empty()).collect();
    assert!(with_data[0].sealed, "the old segment was sealed");
    assert!(with_data.len() >= 2, "the new records went to a new segment");
}

#[test]
fn two_writers_that_saw_the_same_wal_take_different_epochs() {
    let epoch_of = |seed: u64| {
        let h = Harness::start_with(HostConfig { seed, ..config() }, BTreeMap::new());
        let segment = *h.disk.keys().next().unwrap();
        crate::wal::decode_header(segment, &h.disk[&segment]).unwrap()
    };
    let (a, b) = (epoch_of(1), epoch_of(2));
    assert_ne!(a, b);
    assert_eq!(a.0 >> 32, b.0 >> 32, "the same writer generation");
}

#[test]
fn a_configuration_that_reorders_streams_is_refused() {
    let mut cfg = config();
    cfg.streams = vec!["orders".into(), "refunds".into()];
    let mut h = Harness::start_with(cfg.clone(), BTreeMap::new());
    h.open_source();
    h.feed(0, 3);
    // Adding a stream at the end is fine.
    let mut grown = cfg.clone();
    grown.streams.push("audits".into());
    let again = Harness::start_with(grown, h.disk.clone());
    assert_eq!(again.stopped, None);
    // Swapping two is not.
    let mut swapped = cfg;
    swapped.streams.swap(0, 1);
    let refused = Harness::start_with(swapped, h.disk.clone());
    assert_eq!(
        refused.stopped,
        Some(StopReason::NamesChanged { kind: "stream", index: 0, wal: "orders".into(), config: "refunds".into() })
    );
}

#[test]
fn a_segment_that_cannot_be_read_stops_recovery_after_retries() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 3);
    let disk = h.disk.clone();
    let segment = *disk.keys().next().unwrap();
    let mut host = Host::new(config(), Instant::ZERO).unwrap();
    let mut now = Instant::ZERO;
    let mut stopped = None;
    let mut pending: Vec<(IoId, IoOp)> = Vec::new();
    let mut failed_reads = 0;
    for _ in 0..1000 {
        while let Some(out) = host.poll_output() {
            match out {
                Output::Io { id, op } => pending.push((id, op)),
                Output::Stopped(r) => stopped = Some(r),
                Output::Recovered(_) => panic!("recovered without reading a segment"),
                Output::LeaseWait { .. } | Output::Stalled { .. } | Output::Unstalled => {}
            }
        }
        if stopped.is_some() {
            break;
        }
        if let Some((id, op)) = pending.pop() {
            let result = match op {
                IoOp::WalSync => Ok(IoReply::Done),
                IoOp::WalList => Ok(IoReply::Segments(disk.keys().copied().collect())),
                IoOp::WalRead { segment: s } if s == segment => {
                    failed_reads += 1;
                    Err(IoError::Failed)
                }
                IoOp::WalRead { segment: s } => Ok(IoReply::SegmentBytes(disk[&s].clone())),
                other => panic!("unexpected {other:?}"),
            };
            host.handle(now, Input::IoDone { id, result });
        } else {
            now = host.poll_timeout().expect("a retry is scheduled").0;
            host.handle(now, Input::Timeout);
        }
    }
    assert_eq!(stopped, Some(StopReason::WalReadFailed { segment }));
    assert_eq!(failed_reads, WAL_READ_ATTEMPTS, "it retried before giving up");
}

#[test]
fn a_sink_ahead_of_the_wal_stops_recovery_before_anything_is_delivered() {
    // The sink has applied batches 0..=3 of stream 0; this WAL (empty: a
    // new data directory beside an old destination) planned none of them.
    let ahead = vec![(StreamId(0), CompactionSeq(3))];
    let h = Harness::start_full(config(), BTreeMap::new(), BTreeMap::new(), ahead);
    let stop = StopReason::SinkAheadOfWal {
        sink: SinkId(0),
        stream: StreamId(0),
        applied: CompactionSeq(3),
        wal_next: CompactionSeq(0),
    };
    assert_eq!(h.stopped, Some(stop));
    assert!(!h.has(|op| matches!(op, IoOp::SourceOpen { .. } | IoOp::SinkApply(_))), "nothing resumed");
    // A sink that lags, or cannot tell, is fine.
    let behind = Harness::start_full(config(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    assert_eq!(behind.stopped, None);
}
