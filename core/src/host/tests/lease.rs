//! The writer lease, stepped by hand: every lease request is held for the
//! test to answer, as the row in the table would.

use super::*;
use crate::config::LeaseConfig;
use crate::io::{LeaseOp, PluginOp, WalOp};
use crate::time::Duration;

/// The test host's holder id (seed 1).
const ME: u64 = 1 | 1 << 63;

fn lease_config() -> HostConfig {
    let lease = LeaseConfig::from_span(Duration::from_secs(10));
    HostConfig { lease: Some(lease), ..config() }
}

fn secs(s: u64) -> Instant {
    Instant::ZERO + Duration::from_secs(s)
}

fn row(generation: u64, holder: u64, version: u64) -> LeaseRow {
    LeaseRow { generation, holder, version }
}

impl Harness {
    fn start_leased() -> Harness {
        Harness::start_full(lease_config(), BTreeMap::new(), BTreeMap::new(), Vec::new())
    }

    /// The held lease read; answers it with `row`.
    fn answer_read(&mut self, row: Option<LeaseRow>) {
        let (id, ()) = self.take(|op| matches!(op, IoOp::Lease(LeaseOp::Read)).then_some(()));
        self.answer(id, Ok(IoReply::Lease(row)));
    }

    /// The held lease write: its id, expected version and row.
    fn lease_write(&mut self) -> (IoId, Option<u64>, LeaseRow) {
        let (id, (expected, row)) = self.take(|op| match op {
            IoOp::Lease(LeaseOp::Write { expected, row }) => Some((*expected, *row)),
            _ => None,
        });
        (id, expected, row)
    }

    fn has_lease_write(&self) -> bool {
        self.has(|op| matches!(op, IoOp::Lease(LeaseOp::Write { .. })))
    }

    /// Moves the clock to `at` and fires whatever is due.
    fn tick_to(&mut self, at: Instant) {
        self.now = self.now.max(at);
        self.host.handle(self.now, Input::Timeout);
        self.settle();
    }

    /// Under a fresh lease, a group whose append's answer arrives after the
    /// lease's span: a newer writer may have taken over meanwhile and
    /// deleted its segment.
    fn late_commit() -> Harness {
        let mut h = Harness::start_leased();
        h.acquire_and_recover();
        let outputs = h.feed_unsettled(0, 3);
        let (append, ..) = the_append(outputs);
        h.now = secs(11);
        h.answer(append, Ok(IoReply::Done));
        h
    }

    /// Takes a free lease and recovers an empty WAL under it.
    fn acquire_and_recover(&mut self) {
        self.answer_read(None);
        let (id, _, row) = self.lease_write();
        assert_eq!(row.holder, ME);
        self.answer(id, Ok(IoReply::Done));
        assert!(!self.host.is_recovering(), "recovery ran under the new lease");
        self.open_source();
    }
}

#[test]
fn a_free_lease_is_acquired_at_generation_one_then_the_wal_is_recovered() {
    let mut h = Harness::start_leased();
    assert!(h.has(|op| matches!(op, IoOp::Lease(LeaseOp::Read))), "the lease is read before anything else");
    assert!(!h.has(|op| matches!(op, IoOp::Wal(WalOp::List))), "the WAL is not touched before the lease is ours");
    h.answer_read(None);
    let (id, expected, written) = h.lease_write();
    assert_eq!((expected, written), (None, row(1, ME, 1)), "created only where there is no row");
    assert!(h.host.is_recovering());
    h.answer(id, Ok(IoReply::Done));
    assert!(!h.host.is_recovering());
    assert_eq!(h.host.poll_timeout(), Some((secs(2), Timer::Lease)), "the first renewal is due");
    assert_eq!(h.stopped, None);
}

#[test]
fn the_holder_renews_every_interval_by_bumping_the_version() {
    let mut h = Harness::start_leased();
    h.acquire_and_recover();
    h.tick_to(secs(2));
    let (id, expected, written) = h.lease_write();
    assert_eq!((expected, written), (Some(1), row(1, ME, 2)));
    h.answer(id, Ok(IoReply::Done));
    assert_eq!(h.host.poll_timeout(), Some((secs(4), Timer::Lease)));
    h.tick_to(secs(4));
    let (_, expected, written) = h.lease_write();
    assert_eq!((expected, written), (Some(2), row(1, ME, 3)), "each renewal expects the last version");
}

#[test]
fn a_renewal_refused_then_a_row_of_another_holder_means_the_lease_is_lost() {
    let mut h = Harness::start_leased();
    h.acquire_and_recover();
    h.tick_to(secs(2));
    let (id, ..) = h.lease_write();
    h.answer(id, Err(IoError::Conflict));
    assert_eq!(h.stopped, None, "a refused renewal is looked into first");
    let (at, timer) = h.host.poll_timeout().unwrap();
    assert_eq!(timer, Timer::Lease);
    h.tick_to(at);
    h.answer_read(Some(row(2, 42, 9)));
    assert_eq!(h.stopped, Some(StopReason::LeaseLost { holder: 42, generation: 2 }));
}

#[test]
fn a_renewal_whose_answer_was_lost_keeps_the_lease_when_the_row_is_still_ours() {
    let mut h = Harness::start_leased();
    h.acquire_and_recover();
    h.tick_to(secs(2));
    let (id, ..) = h.lease_write();
    h.answer(id, Err(IoError::Ambiguous));
    let (at, _) = h.host.poll_timeout().unwrap();
    h.tick_to(at);
    h.answer_read(Some(row(1, ME, 2)));
    assert_eq!(h.stopped, None);
    h.tick_to(at + Duration::from_secs(2));
    let (_, expected, _) = h.lease_write();
    assert_eq!(expected, Some(2), "the next renewal goes on from the row read back");
}

#[test]
fn another_holders_lease_is_taken_over_only_after_its_row_stays_unchanged_for_the_span() {
    let mut h = Harness::start_leased();
    h.answer_read(Some(row(3, 42, 7)));
    assert_eq!(h.lease_waits, vec![42], "the wait is reported once");
    assert!(!h.has_lease_write());
    for s in 1..=9 {
        h.tick_to(secs(s));
        h.answer_read(Some(row(3, 42, 7)));
        assert!(!h.has_lease_write(), "no takeover at {s} s: the span has not passed");
    }
    // The holder renews: the span starts again from this sighting.
    h.tick_to(secs(10));
    h.answer_read(Some(row(3, 42, 8)));
    assert!(!h.has_lease_write());
    assert_eq!(h.lease_waits, vec![42], "a renewal of the same holder is not a new wait");
    for s in 11..20 {
        h.tick_to(secs(s));
        h.answer_read(Some(row(3, 42, 8)));
        assert!(!h.has_lease_write(), "no takeover at {s} s");
    }
    h.tick_to(secs(20));
    h.answer_read(Some(row(3, 42, 8)));
    let (id, expected, written) = h.lease_write();
    assert_eq!((expected, written), (Some(8), row(4, ME, 9)), "taken over under the next generation");
    h.answer(id, Ok(IoReply::Done));
    // What the old holder sent while its lease was valid (a delete above
    // all) may land for 45 % of a span yet: recovery reads after that.
    assert!(h.host.is_recovering(), "recovery waits out the old holder's requests");
    assert!(h.deleted.is_empty() && h.host.committed().partitions.is_empty());
    h.tick_to(secs(20) + Duration::from_millis(4_499));
    assert!(h.host.is_recovering());
    h.tick_to(secs(20) + Duration::from_millis(4_500));
    assert!(!h.host.is_recovering(), "then recovers");
}

#[test]
fn a_free_or_released_lease_is_recovered_under_at_once() {
    let mut h = Harness::start_leased();
    h.answer_read(Some(row(3, 0, 7)));
    let (id, expected, written) = h.lease_write();
    assert_eq!((expected, written), (Some(7), row(4, ME, 8)));
    h.answer(id, Ok(IoReply::Done));
    assert!(!h.host.is_recovering(), "a released lease has nothing in flight");
}

#[test]
fn a_commit_that_lands_after_the_lease_may_have_lapsed_waits_for_a_read_of_the_row() {
    let mut h = Harness::late_commit();
    assert!(h.host.committed().partitions.is_empty(), "not applied before the row is read");
    assert!(!h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceAck { .. }))));
    h.answer_read(Some(row(1, ME, 1)));
    assert_eq!(h.host.committed().partitions[&key0()].position, Position(3), "applied once the row is ours");
    assert!(
        !h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceAck { .. }))),
        "acks still wait for a renewal that lands"
    );
    let (at, _) = h.host.poll_timeout().unwrap();
    h.tick_to(at);
    let (id, ..) = h.lease_write();
    h.answer(id, Ok(IoReply::Done));
    assert!(h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceAck { .. }))), "acked under a renewed lease");
}

#[test]
fn a_late_commit_under_a_lease_taken_over_is_never_applied() {
    let mut h = Harness::late_commit();
    h.answer_read(Some(row(2, 42, 1)));
    assert_eq!(h.stopped, Some(StopReason::LeaseLost { holder: 42, generation: 2 }));
    assert!(h.host.committed().partitions.is_empty());
    assert!(!h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SourceAck { .. }))));
}

#[test]
fn a_clean_shutdown_releases_the_lease_after_the_renewal_in_flight() {
    let mut h = Harness::start_leased();
    h.acquire_and_recover();
    h.tick_to(secs(2));
    let (renewal, _, renewed) = h.lease_write();
    h.host.handle(h.now, Input::Shutdown);
    h.settle();
    let (read, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    h.answer(read, Ok(IoReply::Batches { batches: vec![], exhausted: false }));
    assert!(!h.has_lease_write(), "no release races the renewal in flight");
    assert_eq!(h.stopped, None);
    h.answer(renewal, Ok(IoReply::Done));
    let (release, expected, written) = h.lease_write();
    assert_eq!(
        (expected, written),
        (Some(renewed.version), row(1, 0, renewed.version + 1)),
        "released from the renewed row"
    );
    assert_eq!(h.stopped, None, "stopped only once the release lands");
    h.answer(release, Ok(IoReply::Done));
    assert_eq!(h.stopped, Some(StopReason::Clean));
}

#[test]
fn a_release_refused_is_sent_again_from_the_row_read_back() {
    let mut h = Harness::start_leased();
    h.acquire_and_recover();
    h.host.handle(h.now, Input::Shutdown);
    h.settle();
    let (read, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    h.answer(read, Ok(IoReply::Batches { batches: vec![], exhausted: false }));
    let (release, ..) = h.lease_write();
    h.answer(release, Err(IoError::Conflict));
    let (at, _) = h.host.poll_timeout().unwrap();
    h.tick_to(at);
    h.answer_read(Some(row(1, ME, 5)));
    let (release, expected, written) = h.lease_write();
    assert_eq!((expected, written), (Some(5), row(1, 0, 6)));
    h.answer(release, Ok(IoReply::Done));
    assert_eq!(h.stopped, Some(StopReason::Clean));
}

#[test]
fn a_shutdown_while_waiting_for_another_holder_stops_at_once() {
    let mut h = Harness::start_leased();
    h.answer_read(Some(row(3, 42, 7)));
    h.host.handle(h.now, Input::Shutdown);
    h.settle();
    assert_eq!(h.stopped, Some(StopReason::Clean), "nothing of ours to drain");
}

/// A drain that runs out of time behind a lagging sink, the WAL idle:
/// the run gives the lease up before it stops, so that the next start
/// need not wait for it to lapse.
#[test]
fn a_drain_that_times_out_still_releases_the_lease_when_the_wal_is_idle() {
    let mut h = Harness::start_leased();
    h.acquire_and_recover();
    h.feed(0, 3);
    h.host.handle(h.now, Input::Shutdown);
    h.settle();
    let (read, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    h.answer(read, Ok(IoReply::Batches { batches: vec![], exhausted: false }));
    // The sink never answers; renewals keep the lease until the deadline.
    let release = loop {
        assert_eq!(h.stopped, None, "stopped only once the release lands");
        if h.has_lease_write() {
            let (id, _, written) = h.lease_write();
            if written.holder == 0 {
                break id;
            }
            h.answer(id, Ok(IoReply::Done));
            continue;
        }
        assert!(h.now < secs(300), "no release by {:?}", h.now);
        let (at, _) = h.host.poll_timeout().expect("a deadline");
        h.tick_to(at);
    };
    h.answer(release, Ok(IoReply::Done));
    assert_eq!(h.stopped, Some(StopReason::DrainTimedOut));
    assert!(h.stop_record.is_some(), "the stop record, written first");
}
