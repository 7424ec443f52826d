//! Schemas, and what recovery refuses or repairs.

use super::*;
use crate::io::{PluginOp, WalOp};

fn schema_config() -> HostConfig {
    HostConfig { schema_plugin: true, ..config() }
}

fn batch_with_schema(from: u64, to: u64, schema: &str) -> SourceBatchIn {
    let records = (from..to).map(|p| Record { position: Position(p), bytes: vec![p as u8] }).collect();
    SourceBatchIn { schema: Some(Arc::from(schema.as_bytes())), ..batch_of(records, to) }
}

impl Harness {
    fn start_with(cfg: HostConfig, disk: BTreeMap<SegmentId, Vec<u8>>) -> Harness {
        Harness::start_full(cfg, disk, BTreeMap::new(), Vec::new())
    }

    fn read_with(&mut self, batch: SourceBatchIn) {
        let (id, ()) = self.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
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
        IoOp::Plugin(PluginOp::SchemaDecide { stream, .. }) => Some(*stream),
        _ => None,
    });
    assert_eq!(stream, StreamId(0));
    assert!(!h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. }))), "the source waits for the decision");
    h.answer(ask, Ok(IoReply::Schema { accept: true, reason: String::new() }));
    assert_eq!(h.committed_positions(), vec![0, 1, 2]);
    // Restarted, the source sends the same schema again: no new question.
    let mut again = Harness::start_with(schema_config(), h.disk.clone());
    again.open_source();
    again.read_with(batch_with_schema(3, 5, r#"{"v":1}"#));
    assert!(
        !again.has(|op| matches!(op, IoOp::Plugin(PluginOp::SchemaDecide { .. }))),
        "a committed decision is not asked again"
    );
    assert_eq!(again.committed_positions(), vec![0, 1, 2, 3, 4]);
    // A new schema is asked about; a refusal stops the engine.
    again.read_with(batch_with_schema(5, 6, r#"{"v":2}"#));
    let (ask, ()) = again.take(|op| matches!(op, IoOp::Plugin(PluginOp::SchemaDecide { .. })).then_some(()));
    again.answer(ask, Ok(IoReply::Schema { accept: false, reason: "v2 drops a column".into() }));
    assert!(matches!(&again.stopped, Some(StopReason::SchemaRejected { reason, .. }) if reason == "v2 drops a column"));
    assert_eq!(again.committed_positions(), vec![0, 1, 2, 3, 4], "nothing under the refused schema");
}

#[test]
fn with_dead_letters_records_under_a_refused_schema_are_committed_quarantined_and_the_rest_goes_on() {
    let letters = Some(crate::config::DeadLetters { max: 100, window: 1_000 });
    let mut h = Harness::start_with(HostConfig { dead_letters: letters, ..schema_config() }, BTreeMap::new());
    h.open_source();
    // Record 1 breaks an intake rule too: it is wrapped once, with intake's reason.
    let fault = RecordFault::NotJson("EOF".into());
    let faults = vec![IntakeFault { position: Position(1), fault, why: "fix it".into() }];
    h.read_with(SourceBatchIn { faults, ..batch_with_schema(0, 2, r#"{"v":2}"#) });
    let (ask, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SchemaDecide { .. })).then_some(()));
    h.answer(ask, Ok(IoReply::Schema { accept: false, reason: "v2 drops a column".into() }));
    assert_eq!(h.stopped, None);
    assert_eq!(h.committed_positions(), vec![0, 1], "taken in, positions dense");
    // Refused once, not asked again in this run; another schema is asked.
    h.read_with(batch_with_schema(2, 3, r#"{"v":2}"#));
    assert!(!h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SchemaDecide { .. }))));
    h.read_with(batch_with_schema(3, 4, r#"{"v":1}"#));
    let (ask, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SchemaDecide { .. })).then_some(()));
    h.answer(ask, Ok(IoReply::Schema { accept: true, reason: String::new() }));
    assert_eq!(h.committed_positions(), vec![0, 1, 2, 3]);
    let files: Vec<(SegmentId, &[u8])> = h.disk.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    let mut reasons = Vec::new();
    for frame in scan(&files, false).unwrap().into_iter().flat_map(|s| s.groups).flat_map(|g| g.frames) {
        if let Frame::SourceBatch(b) = frame {
            for r in &b.records {
                let q = crate::dead_letters::quarantined(&r.bytes);
                reasons.push((r.position.0, q.map(|q| (q.reason.to_string(), q.record.to_vec()))));
            }
        }
    }
    let refused =
        |p: u8| Some(("refused at intake: the schema plugin refused its schema: v2 drops a column".into(), vec![p]));
    let at_intake = Some(("refused at intake: it is not exactly one JSON value: EOF".into(), vec![1]));
    assert_eq!(reasons, vec![(0, refused(0)), (1, at_intake), (2, refused(2)), (3, None)]);
}

#[test]
fn a_checkpoint_larger_than_a_group_is_a_protocol_error_not_a_stuck_wal() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    let (id, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    let records = vec![Record { position: Position(0), bytes: vec![1] }];
    let checkpoint = Some(vec![b'c'; 5000]);
    let batch = SourceBatchIn {
        partition: 0,
        stream: StreamId(0),
        records,
        end: Position(1),
        checkpoint,
        schema: None,
        faults: Vec::new(),
        window: Window::None,
        keys: Vec::new(),
    };
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
                Output::WalFull { .. } | Output::WalRoom { .. } | Output::Skip { .. } | Output::Refused { .. } => {}
                Output::BatchSkip { .. } | Output::Split { .. } | Output::TailCut { .. } => {}
                Output::Send(_)
                | Output::TellRemoved { .. }
                | Output::Role { .. }
                | Output::JoinRefused { .. }
                | Output::LogRestored(_) => {
                    unreachable!("not clustered")
                }
            }
        }
        if stopped.is_some() {
            break;
        }
        if let Some((id, op)) = pending.pop() {
            let result = match op {
                IoOp::Wal(WalOp::Sync) => Ok(IoReply::Done),
                IoOp::Wal(WalOp::List) => {
                    Ok(IoReply::Segments(WalListing::Files(disk.iter().map(|(id, b)| (*id, b.len() as u64)).collect())))
                }
                IoOp::Wal(WalOp::ReadStopRecord) => Ok(IoReply::StopRecord(None)),
                IoOp::Wal(WalOp::ReadAt { segment: s, .. }) if s == segment => {
                    failed_reads += 1;
                    Err(IoError::Failed)
                }
                IoOp::Wal(WalOp::ReadAt { segment: s, offset, len }) => {
                    Ok(IoReply::SegmentBytes(super::window(&disk[&s], offset, len).into()))
                }
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
    assert!(
        !h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceOpen { .. }) | IoOp::Plugin(PluginOp::SinkApply(_)))),
        "nothing resumed"
    );
    // A sink that lags, or cannot tell, is fine.
    let behind = Harness::start_full(config(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    assert_eq!(behind.stopped, None);
}

#[test]
fn leftovers_below_an_object_store_wal_are_deleted_by_the_engine_before_the_fence_and_never_read() {
    // Segment 5: the groups of a deletion a crash interrupted (its header
    // went first). Segment 6: a spare, header only. Segment 5 is not on the
    // harness's disk: reading it would panic.
    let mut spare = vec![0; config().limits.segment_bytes as usize];
    let header = encode_header(SegmentId(6), Epoch(1 << 32));
    spare[..header.len()].copy_from_slice(&header);
    let disk = BTreeMap::from([(SegmentId(6), spare)]);
    let objects = BTreeMap::from([(SegmentId(5), vec![SEGMENT_HEADER_BYTES as u64]), (SegmentId(6), vec![0])]);
    let mut h = Harness::start_objects(disk, objects);
    assert_eq!(h.stopped, None);
    assert_eq!(h.deleted, vec![SegmentId(5)], "the leftover is deleted, and only it");
    assert!(!h.host.is_recovering(), "the fence went in after the deletion");
    h.open_source();
    h.feed(0, 3);
    assert_eq!(h.committed_positions(), vec![0, 1, 2], "the WAL goes on in the spare");
}
