//! Windows (section 22): a source's provisional batches committed as they
//! come and taken as read only when a closing batch commits; a restart, or
//! recovery, voids an open window, whose positions are never used again;
//! the bookmark rule drops records a resumed source sends again.

use super::*;
use crate::wal::WindowEnd;

impl Harness {
    fn send(&mut self, batches: Vec<SourceBatchIn>) {
        let (id, ()) = self.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
        self.answer(id, Ok(IoReply::Batches { batches, exhausted: false }));
    }

    /// Every window end the WAL holds, in order.
    fn window_ends(&self) -> Vec<WindowEnd> {
        let files: Vec<(SegmentId, &[u8])> = self.disk.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let frames = scan(&files, false).unwrap().into_iter().flat_map(|s| s.groups).flat_map(|g| g.frames);
        frames.filter_map(|f| if let Frame::Window(x) = f { Some(x) } else { None }).collect()
    }

    fn acks_held(&self) -> bool {
        self.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceAck { .. })))
    }
}

/// Rows `rows` of partition 0 at positions from `at`, each under resume key
/// `row / 2` (two rows share each key), as a tap sends them.
fn rows(rows: std::ops::Range<u64>, at: u64, window: Window) -> SourceBatchIn {
    let n = rows.end - rows.start;
    let records = rows.clone().enumerate().map(|(i, r)| Record { position: Position(at + i as u64), bytes: row(r) });
    let mut b = batch_of(records.collect(), at + n);
    b.keys = rows.map(|r| Some(r / 2)).collect();
    b.window = window;
    b
}

fn row(r: u64) -> Vec<u8> {
    format!("{{\"id\":{r}}}").into_bytes()
}

fn close(at: u64, checkpoint: &str) -> SourceBatchIn {
    SourceBatchIn { checkpoint: Some(checkpoint.as_bytes().to_vec()), ..rows(0..0, at, Window::Close) }
}

fn restart() -> SourceBatchIn {
    rows(0..0, 0, Window::Restart)
}

#[test]
fn a_windows_records_commit_as_they_come_and_count_only_once_it_closes() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.send(vec![rows(0..5, 0, Window::Open)]);
    assert_eq!(h.committed_positions(), vec![0, 1, 2, 3, 4], "committed as they come");
    assert!(!h.acks_held(), "nothing acknowledged");
    assert!(h.offsets.is_empty(), "nothing materialized");
    assert!(!h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))), "nothing planned");
    let committed = h.host.committed();
    assert!(!committed.partitions.contains_key(&key0()));
    assert_eq!(committed.windows[&SourceId(0)][&0].to, Position(5));
    h.send(vec![rows_at(5, 7, Window::Close).with_checkpoint("state-1")]);
    assert!(h.acks_held());
    let stored = OffsetValue::decode(&h.offsets[&key0()]).unwrap();
    assert_eq!((stored.position, stored.records), (Position(7), 7));
    let (_, records) = h.sink_records();
    assert_eq!(records, (0..7).map(row).collect::<Vec<_>>());
    let p = &h.host.committed().partitions[&key0()];
    assert_eq!(p.checkpoint.as_deref(), Some(&b"state-1"[..]));
    assert_eq!(h.window_ends().len(), 1);
}

impl SourceBatchIn {
    fn with_checkpoint(mut self, checkpoint: &str) -> SourceBatchIn {
        self.checkpoint = Some(checkpoint.as_bytes().to_vec());
        self
    }
}

/// `rows(a..b, ...)` shorthand for rows numbered as their positions.
fn rows_at(from: u64, to: u64, window: Window) -> SourceBatchIn {
    rows(from..to, from, window)
}

#[test]
fn a_restart_voids_the_open_window_and_its_positions_are_never_used_again() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.send(vec![rows_at(0, 3, Window::Open), close(3, "state-1")]);
    let (id, ..) = h.sink_apply();
    h.answer(id, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 3 }));
    h.send(vec![rows_at(3, 6, Window::Open)]);
    // The tap died and runs again from state-1: rows 3.. come again, at
    // new positions.
    h.send(vec![restart(), rows(3..6, 6, Window::Open), close(9, "state-2")]);
    let ends = h.window_ends();
    assert_eq!(ends.iter().map(|x| x.closed).collect::<Vec<_>>(), vec![true, false, true]);
    assert_eq!((ends[1].parts[0].from, ends[1].parts[0].to), (Position(3), Position(6)));
    let (_, records) = h.sink_records();
    assert_eq!(records, (3..6).map(row).collect::<Vec<_>>(), "the void window's records are never sent");
    let committed = h.host.committed();
    assert_eq!(committed.partitions[&key0()].position, Position(9));
    assert_eq!(committed.partitions[&key0()].records, 6);
    assert_eq!(committed.acked(SinkId(0), key0()), Position(6), "delivered all before the void window: past it");
}

#[test]
fn a_sink_that_reaches_a_void_window_moves_past_it() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.send(vec![rows_at(0, 3, Window::Open), close(3, "state-1")]);
    // The sink holds the batch of 0..3 when the window after it is void.
    let (id, ..) = h.sink_apply();
    h.send(vec![rows_at(3, 6, Window::Open), restart()]);
    assert_eq!(h.host.committed().acked(SinkId(0), key0()), Position(0));
    h.answer(id, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 3 }));
    let committed = h.host.committed();
    assert_eq!(committed.acked(SinkId(0), key0()), Position(6), "past the void window");
    assert!(committed.voids.is_empty(), "forgotten once every sink passed it");
}

#[test]
fn recovery_voids_an_open_window_and_the_source_resumes_past_it() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.send(vec![rows_at(0, 2, Window::Open), close(2, "state-1"), rows_at(2, 5, Window::Open)]);
    let mut h = Harness::start(h.disk.clone(), h.offsets.clone());
    let resume = h.open_source();
    assert_eq!(resume.len(), 1);
    assert_eq!(resume[0].position, Position(5), "past the void window");
    assert_eq!(resume[0].checkpoint.as_deref(), Some(&b"state-1"[..]), "from the last closed window");
    let ends = h.window_ends();
    assert_eq!(ends.iter().map(|x| x.closed).collect::<Vec<_>>(), vec![true, false]);
    // The restarted tap sends rows 2.. again, from position 5.
    h.send(vec![restart(), rows(2..4, 5, Window::Open), close(7, "state-2")]);
    let (_, first) = h.sink_records();
    assert_eq!(first, (0..2).map(row).collect::<Vec<_>>());
    let committed = h.host.committed();
    assert_eq!(committed.partitions[&key0()].position, Position(7));
    assert_eq!(committed.partitions[&key0()].records, 4);
    // A second start finds nothing open: nothing more is voided.
    let h = Harness::start(h.disk.clone(), h.offsets.clone());
    assert_eq!(h.window_ends().len(), 3);
}

#[test]
fn a_batch_outside_an_open_window_is_a_protocol_error() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.send(vec![rows_at(0, 2, Window::Open), batch(2, 4)]);
    assert!(matches!(h.stopped, Some(StopReason::SourceProtocol { .. })), "{:?}", h.stopped);
}

#[test]
fn the_bookmark_rule_drops_the_tail_sent_again_once_and_delivers_what_differs() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    // Rows 0..6: keys 0, 0, 1, 1, 2, 2; the tail is rows 4 and 5 (key 2).
    h.send(vec![rows_at(0, 6, Window::Open), close(6, "state-1")]);
    let tail = &h.host.committed().tails[&key0()];
    assert_eq!((tail.key, tail.digests.len(), tail.more), (2, 2, false));
    let (id, ..) = h.sink_apply();
    h.answer(id, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 6 }));
    // Resumed inclusively: row 5 again, row 4 updated, row 5 a second
    // time (a new row with the same bytes), then rows of key 3.
    let mut again = rows(0..0, 6, Window::Open);
    let sent = [row(5), b"{\"id\":4,\"v\":2}".to_vec(), row(5), row(6), row(7)];
    again.records =
        sent.iter().enumerate().map(|(i, b)| Record { position: Position(6 + i as u64), bytes: b.clone() }).collect();
    again.keys = vec![Some(2), Some(2), Some(2), Some(3), Some(3)];
    again.end = Position(11);
    h.send(vec![restart(), again, close(11, "state-2")]);
    let (_, records) = h.sink_records();
    assert_eq!(records, sent[1..].to_vec(), "the tail's row 5 dropped once, the rest delivered");
    // The new tail: key 3's rows.
    let tail = &h.host.committed().tails[&key0()];
    assert_eq!((tail.key, tail.digests.len()), (3, 2));
}

#[test]
fn the_bookmark_rule_holds_across_a_restart_of_the_daemon() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.send(vec![rows_at(0, 6, Window::Open), close(6, "state-1")]);
    let (id, ..) = h.sink_apply();
    h.answer(id, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 6 }));
    let mut h = Harness::start(h.disk.clone(), h.offsets.clone());
    h.open_source();
    // Resumed from state-1: rows 4 and 5 again (key 2), then row 6.
    h.send(vec![restart(), rows(4..7, 6, Window::Open), close(9, "state-2")]);
    let (_, records) = h.sink_records();
    assert_eq!(records, vec![row(6)]);
    // Without the restart's mark (a source that does not say it resumed),
    // nothing is dropped: the rule is armed only by a restart.
    let mut h = Harness::start(h.disk.clone(), h.offsets.clone());
    h.open_source();
    h.send(vec![rows(6..8, 9, Window::Open), close(11, "state-3")]);
    assert_eq!(h.host.committed().partitions[&key0()].records, 6 + 1 + 2, "row 6 again, and row 7");
}

#[test]
fn a_window_that_fills_the_wal_stops_the_engine_naming_the_limit() {
    let limits = Limits { wal_bytes_max: 3 * 64 * 1024, ..config().limits };
    let mut h = Harness::start_full(HostConfig { limits, ..config() }, BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    let mut at = 0;
    for _ in 0..10_000 {
        if h.stopped.is_some() {
            break;
        }
        if !h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. }))) {
            break;
        }
        let records = (at..at + 20).map(|p| Record { position: Position(p), bytes: vec![b'x'; 200] }).collect();
        let mut b = batch_of(records, at + 20);
        b.window = Window::Open;
        h.send(vec![b]);
        at += 20;
    }
    assert!(
        matches!(h.stopped, Some(StopReason::WindowTooLarge { source: SourceId(0), limit }) if limit == 3 * 64 * 1024),
        "{:?} after {at} records",
        h.stopped
    );
}

#[test]
fn a_close_too_large_for_a_group_keeps_fewer_digests_and_a_checkpoint_too_large_stops() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    // Four partitions of 200 records under one key each: 6,400 bytes of
    // digests, more than a group of this engine (4 KiB) holds.
    let n = 200;
    let batches: Vec<SourceBatchIn> = (0..4)
        .map(|p| {
            let mut b = rows_at(0, n, Window::Open);
            b.partition = p;
            b.keys = vec![Some(1); n as usize];
            b
        })
        .collect();
    h.send(batches);
    h.send(vec![close(n, "state-1")]);
    assert!(h.stopped.is_none(), "{:?}", h.stopped);
    let tails = &h.host.committed().tails;
    assert_eq!(tails.len(), 4);
    assert!(tails.values().any(|t| t.more && t.digests.len() < n as usize), "trimmed");
    assert!(!h.tail_cuts.is_empty(), "each tail cut is said");
    let kept: usize = tails.values().map(|t| t.digests.len()).sum();
    assert!((400..512).contains(&kept), "trimmed only as far as needed: {kept}");
    // A checkpoint larger than a group: the source broke the protocol.
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.send(vec![rows_at(0, 1, Window::Open), close(1, &"s".repeat(5000))]);
    assert!(matches!(h.stopped, Some(StopReason::SourceProtocol { .. })), "{:?}", h.stopped);
}

#[test]
fn a_partition_changing_stream_inside_its_window_is_refused_before_anything_commits() {
    let cfg = || HostConfig { streams: vec!["orders".into(), "refunds".into()], ..config() };
    let mut h = Harness::start_full(cfg(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    let mut other = rows_at(2, 4, Window::Open);
    other.stream = StreamId(1);
    h.send(vec![rows_at(0, 2, Window::Open), other]);
    assert!(matches!(h.stopped, Some(StopReason::SourceProtocol { .. })), "{:?}", h.stopped);
    // What did commit recovers (the window is void): no assertion trips.
    let h = Harness::start_full(cfg(), h.disk.clone(), h.offsets.clone(), Vec::new());
    assert!(h.stopped.is_none(), "{:?}", h.stopped);
}

#[test]
fn a_lost_segment_holding_a_closed_windows_first_records_is_noticed() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    // A window over more than a segment, closed, never delivered.
    let mut at = 0;
    while h.disk.len() < 3 {
        let records = (at..at + 10).map(|p| Record { position: Position(p), bytes: vec![b'x'; 300] }).collect();
        let mut b = batch_of(records, at + 10);
        b.window = Window::Open;
        h.send(vec![b]);
        at += 10;
    }
    h.send(vec![close(at, "state-1")]);
    assert!(h.stopped.is_none(), "{:?}", h.stopped);
    // The first segment deleted by hand: the next segment's snapshot names
    // the window open, and nothing of it reached the sink.
    let mut disk = h.disk.clone();
    let first = *disk.keys().next().unwrap();
    disk.remove(&first);
    let h = Harness::start(disk, h.offsets.clone());
    assert!(matches!(h.stopped, Some(StopReason::WalIncomplete(_))), "{:?}", h.stopped);
}
