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
/// ends is reported at the next one. Under `--once` it ends the run after
/// the stop limit as the WAL's stall does: a host started after the others
/// finished a `--once` run never hears a peer again.
///
/// A stall is named by what arrived since it began: nothing (`RaftNoPeer`,
/// the peers are down or unreachable) or some message (`RaftQuorum`, peers
/// talk but no majority forms). Peers heard in the stall's first instant
/// and gone since (killed while a proposal waited) make it `RaftQuorum` at
/// first; once no peer has been heard for `silence` it is reported again,
/// once, as `RaftNoPeer`, so the operator reads what holds now.
#[derive(Debug)]
pub(super) struct QuorumWatch {
    report_after: Option<Duration>,
    stop_after: Option<Duration>,
    /// How long without a peer's message counts as silence: longer than a
    /// live peer ever keeps quiet (it answers heartbeats, or campaigns once
    /// an election timeout).
    silence: Duration,
    /// Since when this host has known no leader, or, leading, has waited
    /// for its proposal to commit.
    since: Option<Instant>,
    /// What the stall was last reported as, if it was.
    reported: Option<Stall>,
    /// When a peer's message last arrived: a stall with none since it
    /// began is reported as silence, not as a missing majority.
    heard_at: Option<Instant>,
}

impl QuorumWatch {
    /// A host starts knowing no leader.
    pub(super) fn new(
        now: Instant,
        report_after: Option<Duration>,
        stop_after: Option<Duration>,
        silence: Duration,
    ) -> QuorumWatch {
        QuorumWatch { report_after, stop_after, silence, since: Some(now), reported: None, heard_at: None }
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
        self.reported.is_some() && self.since.is_none()
    }

    /// The next moment the watch has something to say.
    pub(super) fn deadline(&self) -> Option<Instant> {
        let since = self.since?;
        let report = self.report_after.filter(|_| self.reported.is_none()).map(|d| since + d);
        let stop = self.stop_after.map(|d| since + d);
        let silent = match (self.reported, self.heard_at) {
            (Some(Stall::RaftQuorum), Some(heard)) => Some(heard + self.silence),
            _ => None,
        };
        [report, stop, silent].into_iter().flatten().min()
    }

    /// At a tick: what to say, if anything. A stall's end is reported as
    /// `Unstalled` (`lifted` true).
    pub(super) fn check(&mut self, now: Instant) -> (StallAction, bool) {
        let Some(since) = self.since else {
            let lifted = self.reported.take().is_some();
            return (StallAction::None, lifted);
        };
        let for_ = now.saturating_since(since);
        let what = match self.heard_at {
            Some(heard) if heard >= since => Stall::RaftQuorum,
            _ => Stall::RaftNoPeer,
        };
        if self.stop_after.is_some_and(|d| for_ >= d) {
            return (StallAction::Stop { what, for_ }, false);
        }
        // What holds now: a peer heard during the stall, and lately.
        let quiet_since = self.heard_at.map_or(since, |h| h.max(since));
        let silent_for = now.saturating_since(quiet_since);
        let now_what = if what == Stall::RaftQuorum && silent_for < self.silence { what } else { Stall::RaftNoPeer };
        let action = |what| {
            let for_ = if what == Stall::RaftNoPeer { silent_for } else { for_ };
            (StallAction::Report { what, for_ }, false)
        };
        match self.reported {
            None if self.report_after.is_some_and(|d| for_ >= d) => {
                self.reported = Some(now_what);
                action(now_what)
            }
            Some(Stall::RaftQuorum) if now_what == Stall::RaftNoPeer => {
                self.reported = Some(now_what);
                action(now_what)
            }
            _ => (StallAction::None, false),
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

    #[test]
    fn a_quorum_stall_names_silence_and_stops_at_the_limit_under_once() {
        let mut q = QuorumWatch::new(at(0), None, Some(Duration::from_secs(20)), Duration::from_secs(2));
        assert_eq!(q.deadline(), Some(at(20)), "a host starts knowing no leader");
        assert_eq!(q.check(at(19)), (StallAction::None, false));
        let stop = StallAction::Stop { what: Stall::RaftNoPeer, for_: Duration::from_secs(20) };
        assert_eq!(q.check(at(20)), (stop, false), "no peer was heard: silence");
        q.heard(at(21));
        let stop = StallAction::Stop { what: Stall::RaftQuorum, for_: Duration::from_secs(22) };
        assert_eq!(q.check(at(22)), (stop, false), "heard, but no majority");
        q.quorum();
        assert_eq!(q.deadline(), None);
    }

    #[test]
    fn a_quorum_stall_is_reported_once_and_its_end_at_the_next_tick() {
        let mut q = QuorumWatch::new(at(0), Some(Duration::from_secs(10)), None, Duration::from_secs(2));
        q.heard(at(1));
        q.quorum();
        q.waiting(at(2));
        assert_eq!(q.deadline(), Some(at(12)));
        let report = StallAction::Report { what: Stall::RaftNoPeer, for_: Duration::from_secs(10) };
        assert_eq!(q.check(at(12)), (report, false), "the peer was heard before this stall began");
        assert_eq!(q.deadline(), None, "reported once, and never stopped without --once");
        assert_eq!(q.check(at(40)), (StallAction::None, false));
        q.quorum();
        assert!(q.lifting());
        assert_eq!(q.check(at(41)), (StallAction::None, true));
        assert!(!q.lifting());
    }

    #[test]
    fn a_majority_missing_while_peers_talked_is_reported_again_as_silence_once_they_stop() {
        let mut q = QuorumWatch::new(at(0), Some(Duration::from_secs(10)), None, Duration::from_secs(2));
        q.quorum();
        q.waiting(at(5));
        // A peer answers during the stall, then is gone.
        q.heard(at(14));
        assert_eq!(q.deadline(), Some(at(15)));
        let report = StallAction::Report { what: Stall::RaftQuorum, for_: Duration::from_secs(10) };
        assert_eq!(q.check(at(15)), (report, false), "a peer spoke during the stall");
        assert_eq!(q.deadline(), Some(at(16)), "silence is due two seconds after the last message");
        assert_eq!(q.check(at(15)), (StallAction::None, false));
        let report = StallAction::Report { what: Stall::RaftNoPeer, for_: Duration::from_secs(2) };
        assert_eq!(q.check(at(16)), (report, false), "no peer for two seconds: silence, counted from the last");
        assert_eq!(q.deadline(), None, "said once");
        assert_eq!(q.check(at(30)), (StallAction::None, false));
        // A peer heard early in a stall but long gone by its report: silence at once.
        q.quorum();
        assert_eq!(q.check(at(31)), (StallAction::None, true));
        q.waiting(at(40));
        q.heard(at(41));
        let report = StallAction::Report { what: Stall::RaftNoPeer, for_: Duration::from_secs(9) };
        assert_eq!(q.check(at(50)), (report, false));
        q.quorum();
        assert_eq!(q.check(at(51)), (StallAction::None, true));
        // Peers that keep talking keep it a missing majority.
        q.waiting(at(60));
        for s in 61..80 {
            q.heard(at(s));
            let (action, _) = q.check(at(s));
            assert!(!matches!(action, StallAction::Report { what: Stall::RaftNoPeer, .. }), "{action:?} at {s}");
        }
    }
}
