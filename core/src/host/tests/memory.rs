//! Flat memory: records past the cache are read back from the WAL for the
//! sinks, and sources pause only at the WAL's size limit.

use super::*;
use crate::io::{PluginOp, WalOp};

fn no_cache() -> HostConfig {
    let mut cfg = config();
    cfg.limits.record_cache_bytes = 0;
    cfg
}

#[test]
fn records_past_the_cache_are_read_back_from_the_wal_for_the_sink() {
    let mut h = Harness::start_full(no_cache(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 5);
    assert!(
        !h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))),
        "nothing is sent before the records are read back"
    );
    let (id, groups) = h.read_back();
    h.answer(id, Ok(IoReply::Groups(groups)));
    let (_, records) = h.sink_records();
    assert_eq!(records, (0..5u8).map(|p| vec![p; 3]).collect::<Vec<_>>());
    assert_eq!(h.host.record_bytes(), (0, 15), "held, none of it in memory");
}

#[test]
fn with_room_in_the_cache_nothing_is_read_back() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 5);
    assert!(!h.has(|op| matches!(op, IoOp::Wal(WalOp::ReadGroups { .. }))));
    let (_, records) = h.sink_records();
    assert_eq!(records.len(), 5);
    assert_eq!(h.host.record_bytes(), (15, 15));
}

/// After a sink lagged (it acknowledged nothing), a restart reads the WAL a
/// window at a time and keeps the record cache's bound while it rebuilds:
/// with windows of 256 bytes and a cache of 64 bytes it asks for nothing
/// longer than a window, holds at most 64 record bytes, and hands the sink
/// the same records as a restart that read each segment in one window with
/// every record cached.
#[test]
fn recovery_reads_in_windows_and_keeps_the_cache_bound() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    for i in 0..60 {
        h.feed(i * 5, i * 5 + 5);
    }
    let restart = |window: usize, cache: u64| {
        let mut cfg = config();
        (cfg.limits.read_window_bytes, cfg.limits.record_cache_bytes) = (window, cache);
        let mut again = Harness::start_full(cfg, h.disk.clone(), h.offsets.clone(), Vec::new());
        assert_eq!(again.stopped, None);
        let cached = again.host.record_bytes();
        if again.has(|op| matches!(op, IoOp::Wal(WalOp::ReadGroups { .. }))) {
            let (id, groups) = again.read_back();
            again.answer(id, Ok(IoReply::Groups(groups)));
        }
        let (_, records) = again.sink_records();
        (again.reads, cached, records)
    };
    let (whole, cached, expected) = restart(1 << 20, 1 << 20);
    assert_eq!(whole.len(), h.disk.len(), "each segment in one window");
    assert_eq!(cached, (900, 900), "every record in memory");
    assert_eq!(expected, (0..5u8).map(|p| vec![p; 3]).collect::<Vec<_>>(), "the open plan, replayed");
    let (reads, cached, records) = restart(256, 64);
    assert!(reads.len() > 64 << 10 >> 8, "the segments in windows: {} reads", reads.len());
    // A window; past the data, the search for later commit records starts
    // each read a commit record's length before the last one ended.
    assert!(reads.iter().all(|&(asked, _)| (256..=256 + 64).contains(&asked)), "{reads:?}");
    assert!(cached.0 <= 64 && cached.1 == 900, "{cached:?}");
    assert_eq!(records, expected);
}

#[test]
fn a_read_back_that_keeps_failing_stops_the_engine() {
    let mut h = Harness::start_full(no_cache(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 5);
    let segment = h.disk.keys().next().copied().unwrap();
    for attempt in 1..=WAL_READ_ATTEMPTS {
        let (id, _) = h.read_back();
        h.answer(id, Err(IoError::Failed));
        if attempt < WAL_READ_ATTEMPTS {
            assert_eq!(h.stopped, None, "attempt {attempt} is retried");
            let (at, _) = h.host.poll_timeout().unwrap();
            h.now = at;
            h.host.handle(at, Input::Timeout);
            h.settle();
        }
    }
    assert_eq!(h.stopped, Some(StopReason::WalReadFailed { segment }));
}

#[test]
fn bytes_read_back_that_are_not_the_committed_group_stop_the_engine_as_corruption() {
    let mut h = Harness::start_full(no_cache(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 5);
    let (id, mut groups) = h.read_back();
    let last = groups[0].len() - 1;
    groups[0][last] ^= 1;
    h.answer(id, Ok(IoReply::Groups(groups)));
    assert!(
        matches!(&h.stopped, Some(StopReason::Corrupt(c)) if c.what == crate::wal::READ_BACK_INVALID),
        "{:?}",
        h.stopped
    );
    assert!(!h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))));
}

#[test]
fn sources_pause_at_the_wal_size_limit_and_resume_once_old_segments_go() {
    let mut cfg = config();
    cfg.limits.segment_bytes = 20 * 1024;
    cfg.limits.wal_bytes_max = 3 * cfg.limits.segment_bytes;
    let mut h = Harness::start_full(cfg, BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    let mut next = 0;
    while h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. }))) {
        assert!(next < 100_000, "the WAL never reached its limit");
        h.feed(next, next + 200);
        next += 200;
    }
    assert_eq!(h.wal_full, vec![true], "reported once");
    let kept = h.disk.len();
    // The sink catches up: acknowledged segments are deleted and the
    // sources are read again.
    while h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))) {
        let (id, ..) = h.sink_apply();
        h.answer(id, Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 0 }));
    }
    assert!(!h.deleted.is_empty() && h.disk.len() < kept, "old segments deleted");
    assert_eq!(h.wal_full, vec![true, false]);
    assert!(h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. }))), "sources read again");
}
