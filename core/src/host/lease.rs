//! The writer lease (S3 mode) as a closed state machine, behind the
//! writer-authority gate of `authority.rs`.
//!
//! The lease owns its row, its state and its timing, and talks only to
//! [`Effects`] (it sends its own reads and writes and schedules its own
//! renewals and polls). Each answer is a transition that returns
//! [`LeaseNews`]: what the coordinator must tell the other parts.
//!
//! No clocks are compared across machines. A holder renews by changing the
//! row's version; a waiting writer takes the lease over only after it has
//! seen the same version for `steal_after` of its own monotonic time. The
//! holder commits and acknowledges only while its last successful renewal
//! was sent less than `steal_after` ago, so by the time a waiting writer may
//! steal, the holder has stopped on its own (and the fence and conditional
//! creates stop it even if it has not).

use super::effects::{Effects, Pending, Retry};
use crate::config::LeaseConfig;
use crate::io::LeaseOp;
use crate::io::{IoError, IoOp, LeaseRow, Output, StopReason};
use crate::time::{Duration, Instant};

/// Why a lease write was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Intent {
    /// Take a free, released or abandoned lease.
    Acquire,
    /// Raise the generation above every epoch the WAL holds (a lease table
    /// recreated under an existing WAL).
    Bump,
    Renew,
    /// Give the lease up after a clean shutdown.
    Release,
}

/// What a lease answer means for the rest of the engine.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LeaseNews {
    /// Nothing outside the lease: it sent a request or scheduled a poll.
    Quiet,
    /// This run holds the lease now; recovery may start, after `wait` when
    /// the lease was taken over from another holder (or may have been):
    /// what that holder sent while its lease was valid may still land until
    /// then. `renew_now`: when the acquiring write landed is unknown, so a
    /// renewal goes out at once.
    Acquired { renew_now: bool, wait: Option<Duration> },
    /// The row read back is ours. `commit_verified`: the read was sent after
    /// the commit that waited for it landed.
    Ours { sent_at: Instant, commit_verified: bool },
    /// A renewal or bump landed.
    Renewed,
    /// Given up after a clean drain.
    Released,
    /// Another writer holds the row now (or nobody does).
    Lost(StopReason),
}

/// Where bumping the generation stands, once the lease is settled.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Bump {
    None,
    /// The generation reached the target: recovery goes on.
    Reached,
    /// Still below it: send (another) bump.
    Pending,
}

enum State {
    /// Not ours yet: reading the row, or polling another holder's row.
    /// `seen`: that holder's row and when this host first saw its version.
    Waiting {
        seen: Option<(LeaseRow, Instant)>,
    },
    /// An acquiring write is out; `stealing` from a holder that stopped
    /// renewing (not a free or released row).
    Acquiring {
        seen: Option<(LeaseRow, Instant)>,
        stealing: bool,
    },
    Held(Holding),
    /// A commit landed while the lease may have lapsed: its effects wait
    /// for a read, sent at `since` or later, that shows the row is ours.
    Verifying(Holding, Instant),
    /// Giving it up: a release write, or a read to see what to release.
    Releasing(LeaseRow),
    Released(LeaseRow),
}

#[derive(Clone, Copy)]
struct Holding {
    row: LeaseRow,
    /// The send time of the last write known to have landed, plus
    /// `steal_after`: until then nobody can have taken the lease over.
    valid_until: Option<Instant>,
    /// Recovery waits for the generation to reach this.
    bump_to: Option<u64>,
}

pub(super) struct Lease {
    cfg: LeaseConfig,
    /// This run's holder id; never 0, which marks a released lease.
    me: u64,
    state: State,
    /// A lease read or write is out; its answer schedules what follows.
    busy: bool,
    /// Commits that landed while the lease may have lapsed.
    late_commits: u64,
}

impl Lease {
    pub(super) fn new(cfg: LeaseConfig, seed: u64) -> Lease {
        Lease { cfg, me: seed | 1 << 63, state: State::Waiting { seen: None }, busy: false, late_commits: 0 }
    }

    pub(super) fn valid(&self, now: Instant) -> bool {
        match &self.state {
            State::Held(h) | State::Verifying(h, _) => h.valid_until.is_some_and(|until| now < until),
            _ => false,
        }
    }

    /// Commits that landed while the lease may have lapsed, so far.
    pub(super) fn late_commits(&self) -> u64 {
        self.late_commits
    }

    /// The row this run holds (or held, while releasing).
    pub(super) fn holding(&self) -> Option<LeaseRow> {
        match &self.state {
            State::Waiting { .. } | State::Acquiring { .. } => None,
            State::Held(h) | State::Verifying(h, _) => Some(h.row),
            State::Releasing(row) | State::Released(row) => Some(*row),
        }
    }

    fn holding_mut(&mut self) -> Option<&mut Holding> {
        match &mut self.state {
            State::Held(h) | State::Verifying(h, _) => Some(h),
            _ => None,
        }
    }

    pub(super) fn read(&mut self, fx: &mut Effects) {
        self.busy = true;
        fx.io(Pending::LeaseRead(fx.now), IoOp::Lease(LeaseOp::Read));
    }

    fn write(&mut self, fx: &mut Effects, intent: Intent, expected: Option<u64>, row: LeaseRow) {
        self.busy = true;
        fx.io(Pending::LeaseWrite(intent, row, fx.now), IoOp::Lease(LeaseOp::Write { expected, row }));
    }

    pub(super) fn on_read(
        &mut self,
        fx: &mut Effects,
        sent_at: Instant,
        result: Result<Option<LeaseRow>, IoError>,
    ) -> LeaseNews {
        self.busy = false;
        let row = match result {
            Ok(row) => row,
            Err(_) => {
                fx.retry_later(Retry::LeaseRead);
                return LeaseNews::Quiet;
            }
        };
        fx.succeeded(Retry::LeaseRead);
        match self.state {
            State::Releasing(_) | State::Released(_) => self.read_while_releasing(fx, row),
            State::Held(_) | State::Verifying(..) => self.read_while_holding(fx, sent_at, row),
            State::Waiting { seen } | State::Acquiring { seen, .. } => self.read_while_waiting(fx, seen, row),
        }
    }

    /// After a release whose outcome is unknown: release again from what is
    /// there, or find nothing left to give up.
    fn read_while_releasing(&mut self, fx: &mut Effects, row: Option<LeaseRow>) -> LeaseNews {
        match row {
            Some(r) if r.holder == self.me => {
                self.state = State::Releasing(r);
                let released = LeaseRow { holder: 0, version: r.version + 1, ..r };
                self.write(fx, Intent::Release, Some(r.version), released);
                LeaseNews::Quiet
            }
            // Someone else's now, or gone: nothing left to give up.
            _ => {
                let held = self.holding().expect("releasing a held lease");
                self.state = State::Released(held);
                LeaseNews::Released
            }
        }
    }

    /// Checking after a renewal that failed or whose outcome is unknown, or
    /// for a commit that landed late. Ours whatever its generation (a bump
    /// may have landed unseen): the holder id belongs to this run alone. Its
    /// validity is not extended: when that write landed is unknown.
    fn read_while_holding(&mut self, fx: &mut Effects, sent_at: Instant, row: Option<LeaseRow>) -> LeaseNews {
        let r = match row {
            Some(r) if r.holder == self.me => r,
            Some(r) => return LeaseNews::Lost(StopReason::LeaseLost { holder: r.holder, generation: r.generation }),
            None => return LeaseNews::Lost(StopReason::LeaseLost { holder: 0, generation: 0 }),
        };
        self.holding_mut().expect("holding").row = r;
        let mut commit_verified = false;
        if let State::Verifying(h, since) = self.state {
            if sent_at < since {
                // An answer from before the commit landed: ask again.
                self.read(fx);
                return LeaseNews::Quiet;
            }
            self.state = State::Held(h);
            commit_verified = true;
        }
        LeaseNews::Ours { sent_at, commit_verified }
    }

    fn read_while_waiting(
        &mut self,
        fx: &mut Effects,
        seen: Option<(LeaseRow, Instant)>,
        row: Option<LeaseRow>,
    ) -> LeaseNews {
        let me = self.me;
        let take = |r: &LeaseRow| LeaseRow { generation: r.generation + 1, holder: me, version: r.version + 1 };
        match row {
            None => self.acquire(fx, seen, None, LeaseRow { generation: 1, holder: me, version: 1 }, false),
            // Our own write landed although its answer was lost. When it
            // landed is unknown, so the lease counts as valid only once a
            // renewal, sent now, succeeds; and whether it was taken over
            // from a live holder is unknown, so recovery waits as if it was.
            Some(r) if r.holder == me => {
                self.state = State::Held(Holding { row: r, valid_until: None, bump_to: None });
                self.schedule_renewal(fx);
                return LeaseNews::Acquired { renew_now: true, wait: Some(self.cfg.requests_within) };
            }
            Some(r) if r.holder == 0 => self.acquire(fx, seen, Some(r.version), take(&r), false),
            Some(r) => match seen {
                Some((s, since)) if s == r && fx.now >= since + self.cfg.steal_after => {
                    self.acquire(fx, seen, Some(r.version), take(&r), true)
                }
                Some((s, _)) if s == r => fx.schedule(fx.now + self.cfg.poll, Retry::LeaseRead),
                _ => {
                    if seen.is_none_or(|(s, _)| s.holder != r.holder || s.generation != r.generation) {
                        fx.emit(Output::LeaseWait { holder: r.holder, generation: r.generation });
                    }
                    self.state = State::Waiting { seen: Some((r, fx.now)) };
                    fx.schedule(fx.now + self.cfg.poll, Retry::LeaseRead);
                }
            },
        }
        LeaseNews::Quiet
    }

    fn acquire(
        &mut self,
        fx: &mut Effects,
        seen: Option<(LeaseRow, Instant)>,
        expected: Option<u64>,
        row: LeaseRow,
        stealing: bool,
    ) {
        self.state = State::Acquiring { seen, stealing };
        self.write(fx, Intent::Acquire, expected, row);
    }

    pub(super) fn on_written(
        &mut self,
        fx: &mut Effects,
        intent: Intent,
        row: LeaseRow,
        sent_at: Instant,
        result: Result<(), IoError>,
    ) -> LeaseNews {
        self.busy = false;
        if result.is_err() {
            // Lost, refused or unknown: look at the row to find out (for a
            // release: a renewal whose answer was lost may have landed since).
            if let State::Acquiring { seen, .. } = self.state {
                self.state = State::Waiting { seen };
            }
            fx.retry_later(Retry::LeaseRead);
            return LeaseNews::Quiet;
        }
        let valid_until = Some(sent_at + self.cfg.steal_after);
        match intent {
            Intent::Release => {
                self.state = State::Released(self.holding().expect("releasing a held lease"));
                LeaseNews::Released
            }
            Intent::Acquire => {
                let stealing = matches!(self.state, State::Acquiring { stealing: true, .. });
                self.state = State::Held(Holding { row, valid_until, bump_to: None });
                self.schedule_renewal(fx);
                LeaseNews::Acquired { renew_now: false, wait: stealing.then_some(self.cfg.requests_within) }
            }
            Intent::Bump | Intent::Renew => {
                match &mut self.state {
                    State::Held(h) | State::Verifying(h, _) => {
                        h.row = row;
                        h.valid_until = valid_until;
                    }
                    // A renewal that was out when the release went (a
                    // verifying read cleared `busy` under it): the release
                    // meets a conflict and is sent again from the row read
                    // back.
                    State::Releasing(held) => *held = row,
                    State::Released(_) => {}
                    State::Waiting { .. } | State::Acquiring { .. } => unreachable!("a renewal of a lease never held"),
                }
                LeaseNews::Renewed
            }
        }
    }

    /// The lease is confirmed (renewed, bumped or read back as ours): the
    /// next renewal is scheduled; says whether recovery's bump is done.
    pub(super) fn settle(&mut self, fx: &mut Effects) -> Bump {
        self.schedule_renewal(fx);
        let Some(h) = self.holding_mut() else { return Bump::None };
        match h.bump_to {
            None => Bump::None,
            Some(target) if h.row.generation >= target => {
                h.bump_to = None;
                Bump::Reached
            }
            Some(_) => Bump::Pending,
        }
    }

    fn schedule_renewal(&self, fx: &mut Effects) {
        if !fx.is_scheduled(Retry::LeaseRenew) {
            fx.schedule(fx.now + self.cfg.renew_every, Retry::LeaseRenew);
        }
    }

    /// A commit landed while the lease may have lapsed: read the row (sent
    /// from now on) before its effects apply.
    pub(super) fn verify_commit(&mut self, fx: &mut Effects) {
        self.late_commits += 1;
        if let State::Held(h) | State::Verifying(h, _) = self.state {
            self.state = State::Verifying(h, fx.now);
        }
        self.read(fx);
    }

    /// Raises the generation to the bump target once no other lease request
    /// is out (its answer comes back through `settle`).
    pub(super) fn try_bump(&mut self, fx: &mut Effects) {
        let Some(&mut Holding { row, bump_to: Some(target), .. }) = self.holding_mut() else { return };
        if self.busy {
            return;
        }
        let bumped = LeaseRow { generation: target, version: row.version + 1, ..row };
        self.write(fx, Intent::Bump, Some(row.version), bumped);
    }

    pub(super) fn renew(&mut self, fx: &mut Effects) {
        // While a read or write is out, its answer schedules the next renewal.
        let Some(h) = self.holding_mut() else { return };
        let row = h.row;
        if self.busy {
            return;
        }
        self.write(fx, Intent::Renew, Some(row.version), LeaseRow { version: row.version + 1, ..row });
    }

    /// After the rebuild: the generation must exceed every epoch in the WAL.
    /// False when a bump was sent and recovery waits for it.
    pub(super) fn covers(&mut self, fx: &mut Effects, wal_generation: u64) -> bool {
        let Some(h) = self.holding_mut() else { return true };
        if h.row.generation > wal_generation {
            return true;
        }
        h.bump_to = Some(wal_generation + 1);
        self.try_bump(fx);
        false
    }

    /// Gives the lease up once a clean drain is complete and `wal_idle` (no
    /// commit, delete or creation in flight: once releasing, the writer
    /// starts nothing more). True when there is nothing (more) to release.
    pub(super) fn release(&mut self, fx: &mut Effects, wal_idle: bool) -> bool {
        let row = match self.state {
            State::Waiting { .. } | State::Acquiring { .. } | State::Released(_) => return true,
            State::Releasing(_) => return false,
            State::Held(h) | State::Verifying(h, _) => h.row,
        };
        // After any renewal in flight, so the release does not race it.
        if wal_idle && !self.busy && !fx.is_scheduled(Retry::LeaseRead) {
            self.state = State::Releasing(row);
            self.write(fx, Intent::Release, Some(row.version), LeaseRow { holder: 0, version: row.version + 1, ..row });
        }
        false
    }
}
