//! The stall watch: how long the WAL (or, in S3 mode, the writer lease)
//! has been failing without a single success. It owns its clocks; the host
//! tells it about each WAL or lease completion and asks it for its deadline.
//! Retrying stays safe and goes on; the watch only makes a stall visible
//! (`Output::Stalled` once, `Output::Unstalled` when it ends) and, where the
//! configuration asks (`--once`), ends the run after a limit. In clustered
//! mode, `QuorumWatch` does the same for a missing majority.

use crate::io::Stall;
use crate::time::{Duration, Instant};

/// What the watch says when its deadline passes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum StallAction {
    None,
    /// Report the stall: `what` has failed for `for_` so far.
    Report {
        what: Stall,
        for_: Duration,
    },
    /// The stall outlived the stop limit.
    Stop {
        what: Stall,
        for_: Duration,
    },
}

#[derive(Debug, Default)]
pub(super) struct StallWatch {
    report_after: Option<Duration>,
    stop_after: Option<Duration>,
    /// Since when WAL requests have failed, with none succeeding.
    wal_since: Option<Instant>,
    /// Since when lease requests have failed, with none succeeding.
    lease_since: Option<Instant>,
    reported: bool,
}

impl StallWatch {
    pub(super) fn new(report_after: Option<Duration>, stop_after: Option<Duration>) -> StallWatch {
        StallWatch { report_after, stop_after, ..StallWatch::default() }
    }

    /// A WAL (`lease == false`) or lease request completed. A failure starts
    /// that side's clock; a success stops it. True when this ends a stall
    /// that was reported.
    pub(super) fn on_done(&mut self, now: Instant, lease: bool, ok: bool) -> bool {
        let since = if lease { &mut self.lease_since } else { &mut self.wal_since };
        if !ok {
            since.get_or_insert(now);
            return false;
        }
        *since = None;
        let ended = self.reported && self.oldest().is_none();
        self.reported &= !ended;
        ended
    }

    /// The next moment the watch has something to say.
    pub(super) fn deadline(&self) -> Option<Instant> {
        let (_, since) = self.oldest()?;
        let report = self.report_after.filter(|_| !self.reported).map(|d| since + d);
        let stop = self.stop_after.map(|d| since + d);
        [report, stop].into_iter().flatten().min()
    }

    pub(super) fn on_timeout(&mut self, now: Instant) -> StallAction {
        let Some((what, since)) = self.oldest() else { return StallAction::None };
        let for_ = now.saturating_since(since);
        if self.stop_after.is_some_and(|d| for_ >= d) {
            return StallAction::Stop { what, for_ };
        }
        if !self.reported && self.report_after.is_some_and(|d| for_ >= d) {
            self.reported = true;
            return StallAction::Report { what, for_ };
        }
        StallAction::None
    }

    /// The side that has been failing longest.
    fn oldest(&self) -> Option<(Stall, Instant)> {
        match (self.wal_since, self.lease_since) {
            (Some(w), Some(l)) if l < w => Some((Stall::Lease, l)),
            (Some(w), _) => Some((Stall::Wal, w)),
            (None, Some(l)) => Some((Stall::Lease, l)),
            (None, None) => None,
        }
    }
}

/// Clustered mode's stall: no leader known, or, leading, no commit of a
/// proposed group (without a majority nothing more is acknowledged; the
/// pipeline waits, it never runs on fewer copies). Part `Replication` tells
/// it what raft does; it is checked at every raft tick, and a stall that
/// ends is reported at the next one.
#[derive(Debug)]
pub(super) struct QuorumWatch {
    /// Since when this host has known no leader, or, leading, has waited
    /// for its proposal to commit.
    since: Option<Instant>,
    reported: bool,
    /// When a peer's message last arrived: a stall with none since it
    /// began is reported as silence, not as a missing majority.
    heard_at: Option<Instant>,
}

impl QuorumWatch {
    /// A host starts knowing no leader.
    pub(super) fn new(now: Instant) -> QuorumWatch {
        QuorumWatch { since: Some(now), reported: false, heard_at: None }
    }

    pub(super) fn heard(&mut self, now: Instant) {
        self.heard_at = Some(now);
    }

    /// No leader is known, or this leader proposed: waiting starts, unless
    /// it already had.
    pub(super) fn waiting(&mut self, now: Instant) {
        self.since.get_or_insert(now);
    }

    /// A leader is known (following), or a proposal committed.
    pub(super) fn quorum(&mut self) {
        self.since = None;
    }

    /// A stall was reported and is over: its end is reported at the next
    /// tick, so every tick fires until then.
    pub(super) fn lifting(&self) -> bool {
        self.reported && self.since.is_none()
    }

    pub(super) fn deadline(&self, report_after: Option<Duration>) -> Option<Instant> {
        match (self.since, report_after, self.reported) {
            (Some(since), Some(after), false) => Some(since + after),
            _ => None,
        }
    }

    /// At a tick: what to report, if anything.
    pub(super) fn check(&mut self, now: Instant, report_after: Option<Duration>) -> Option<crate::io::Output> {
        match (self.since, report_after) {
            (Some(since), Some(after)) if !self.reported && now >= since + after => {
                self.reported = true;
                let what = match self.heard_at {
                    Some(heard) if heard >= since => Stall::RaftQuorum,
                    _ => Stall::RaftNoPeer,
                };
                Some(crate::io::Output::Stalled { what, for_: now - since })
            }
            (None, _) if self.reported => {
                self.reported = false;
                Some(crate::io::Output::Unstalled)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Instant {
        Instant::ZERO + Duration::from_secs(s)
    }

    #[test]
    fn a_stall_is_reported_once_ends_with_a_success_and_stops_at_the_limit() {
        let mut w = StallWatch::new(Some(Duration::from_secs(10)), Some(Duration::from_secs(30)));
        assert_eq!(w.deadline(), None, "nothing failing, nothing to watch");
        assert!(!w.on_done(at(1), false, false));
        assert!(!w.on_done(at(5), false, false));
        assert_eq!(w.deadline(), Some(at(11)), "measured from the first failure");
        assert_eq!(w.on_timeout(at(11)), StallAction::Report { what: Stall::Wal, for_: Duration::from_secs(10) });
        assert_eq!(w.deadline(), Some(at(31)), "reported once; the stop comes next");
        assert!(w.on_done(at(12), false, true), "a success ends the reported stall");
        assert_eq!(w.deadline(), None);
        w.on_done(at(40), true, false);
        assert_eq!(w.on_timeout(at(70)), StallAction::Stop { what: Stall::Lease, for_: Duration::from_secs(30) });
    }

    #[test]
    fn one_side_succeeding_does_not_hide_the_other_failing() {
        let mut w = StallWatch::new(Some(Duration::from_secs(10)), None);
        w.on_done(at(0), false, false);
        w.on_done(at(3), true, true);
        assert_eq!(w.deadline(), Some(at(10)), "lease renewals do not make the WAL progress");
        w.on_done(at(4), true, false);
        w.on_done(at(5), true, true);
        assert_eq!(w.deadline(), Some(at(10)), "a passing lease hiccup does not start a stall of its own");
    }
}
