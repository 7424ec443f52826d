//! The writer lease (S3 mode). One writer per WAL: a new writer takes the
//! lease with a conditional write that bumps its generation, then commits a
//! fence group; the generation becomes the high half of its epoch.
//!
//! No clocks are compared across machines. A holder renews by changing the
//! row's version; a waiting writer takes the lease over only after it has
//! seen the same version for `steal_after` of its own monotonic time. The
//! holder commits and acknowledges only while its last successful renewal
//! was sent less than `steal_after` ago, so by the time a waiting writer may
//! steal, the holder has stopped on its own (and the fence and conditional
//! creates stop it even if it has not).

use super::*;

/// Why a lease write was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LeaseIntent {
    /// Take a free, released or abandoned lease.
    Acquire,
    /// Raise the generation above every epoch the WAL holds (a lease table
    /// recreated under an existing WAL).
    Bump,
    Renew,
    /// Give the lease up after a clean shutdown.
    Release,
}

#[derive(Default)]
pub(super) struct LeaseState {
    pub(super) held: Option<LeaseRow>,
    /// Another holder's row and when this host first saw that version.
    seen: Option<(LeaseRow, Instant)>,
    /// The send time of the last write known to have landed, plus
    /// `steal_after`: until then nobody can have taken the lease over.
    valid_until: Option<Instant>,
    /// A lease read or write is outstanding.
    busy: bool,
    /// Recovery waits for the generation to reach this.
    bump_to: Option<u64>,
    /// A commit landed while the lease may have lapsed; its effects wait
    /// for a read that shows the row is still ours.
    verifying_commit: bool,
    verify_since: Instant,
    pub(super) releasing: bool,
    pub(super) released: bool,
}

impl Host {
    fn holder_id(&self) -> u64 {
        // Never 0, which marks a released lease.
        self.cfg.seed | 1 << 63
    }

    /// The writer may commit and acknowledge: it holds a lease it renewed
    /// recently enough that nobody can have taken it over.
    pub(super) fn lease_ok(&self) -> bool {
        self.cfg.lease.is_none()
            || (!self.lease.releasing && self.lease.valid_until.is_some_and(|until| self.now < until))
    }

    /// The high half of this writer's epoch.
    pub(super) fn writer_generation(&self, wal_generation: u64) -> u64 {
        match self.lease.held {
            Some(row) => row.generation,
            None => wal_generation + 1,
        }
    }

    pub(super) fn lease_read(&mut self) {
        self.lease.busy = true;
        self.io(Pending::LeaseRead(self.now), IoOp::LeaseRead);
    }

    fn lease_write(&mut self, intent: LeaseIntent, expected: Option<u64>, row: LeaseRow) {
        self.lease.busy = true;
        self.io(Pending::LeaseWrite(intent, row, self.now), IoOp::LeaseWrite { expected, row });
    }

    pub(super) fn on_lease_read(&mut self, sent_at: Instant, result: Result<IoReply, IoError>) {
        self.lease.busy = false;
        let row = match result {
            Ok(IoReply::Lease(row)) => row,
            Ok(other) => panic!("LeaseRead answered with {other:?}"),
            Err(_) => return self.retry_later(Retry::LeaseRead),
        };
        self.succeeded(Retry::LeaseRead);
        let me = self.holder_id();
        if self.lease.held.is_some() {
            // Checking after a renewal that failed or whose outcome is unknown.
            if self.lease.releasing {
                return match row {
                    Some(r) if r.holder == me => {
                        self.lease.held = Some(r);
                        let released = LeaseRow { holder: 0, version: r.version + 1, ..r };
                        self.lease_write(LeaseIntent::Release, Some(r.version), released);
                    }
                    // Someone else's now, or gone: nothing left to give up.
                    _ => self.lease.released = true,
                };
            }
            // Ours whatever its generation (a bump may have landed unseen):
            // the holder id belongs to this run alone. Its validity is not
            // extended: when that write landed is unknown.
            return match row {
                Some(r) if r.holder == me => {
                    self.lease.held = Some(r);
                    if self.lease.verifying_commit && sent_at >= self.lease.verify_since {
                        self.lease.verifying_commit = false;
                        self.commit_landed();
                    } else if self.lease.verifying_commit {
                        return self.lease_read();
                    }
                    if let Some((stop, since)) = self.recovery.doubt.take() {
                        if sent_at >= since {
                            return self.stop(stop);
                        }
                        // An answer from before the doubt: ask again.
                        self.recovery.doubt = Some((stop, since));
                        return self.lease_read();
                    }
                    self.lease_settled();
                }
                Some(r) => self.stop(StopReason::LeaseLost { holder: r.holder, generation: r.generation }),
                None => self.stop(StopReason::LeaseLost { holder: 0, generation: 0 }),
            };
        }
        let take = |r: &LeaseRow| LeaseRow { generation: r.generation + 1, holder: me, version: r.version + 1 };
        match row {
            None => {
                let row = LeaseRow { generation: 1, holder: me, version: 1 };
                self.lease_write(LeaseIntent::Acquire, None, row);
            }
            // Our own write landed although its answer was lost. When it
            // landed is unknown, so the lease counts as valid only once a
            // renewal, sent now, succeeds.
            Some(r) if r.holder == me => {
                self.lease.held = Some(r);
                self.lease_acquired();
                self.renew_lease();
            }
            Some(r) if r.holder == 0 => self.lease_write(LeaseIntent::Acquire, Some(r.version), take(&r)),
            Some(r) => {
                let steal_after = self.lease_cfg().steal_after;
                match self.lease.seen {
                    Some((seen, since)) if seen == r && self.now >= since + steal_after => {
                        self.lease_write(LeaseIntent::Acquire, Some(r.version), take(&r));
                    }
                    Some((seen, _)) if seen == r => self.schedule(self.now + self.lease_cfg().poll, Retry::LeaseRead),
                    seen => {
                        if seen.is_none_or(|(s, _)| s.holder != r.holder || s.generation != r.generation) {
                            self.out.push_back(Output::LeaseWait { holder: r.holder, generation: r.generation });
                        }
                        self.lease.seen = Some((r, self.now));
                        self.schedule(self.now + self.lease_cfg().poll, Retry::LeaseRead);
                    }
                }
            }
        }
    }

    pub(super) fn on_lease_written(
        &mut self,
        intent: LeaseIntent,
        row: LeaseRow,
        sent_at: Instant,
        result: Result<IoReply, IoError>,
    ) {
        self.lease.busy = false;
        if intent == LeaseIntent::Release {
            if result.is_ok() {
                self.lease.released = true;
                return;
            }
            // A renewal whose answer was lost may have landed since: look,
            // and release again from what is there.
            return self.retry_later(Retry::LeaseRead);
        }
        if result.is_err() {
            // Lost, refused or unknown: look at the row to find out.
            return self.retry_later(Retry::LeaseRead);
        }
        self.lease.held = Some(row);
        self.lease.valid_until = Some(sent_at + self.lease_cfg().steal_after);
        match intent {
            LeaseIntent::Acquire => self.lease_acquired(),
            LeaseIntent::Bump | LeaseIntent::Renew => self.lease_settled(),
            LeaseIntent::Release => unreachable!("handled above"),
        }
    }

    fn lease_acquired(&mut self) {
        self.lease.seen = None;
        self.schedule_renewal();
        self.io(Pending::WalSync, IoOp::WalSync);
    }

    /// A bump or renewal is confirmed, or the row read back is ours: carry
    /// on with what waited for it.
    fn lease_settled(&mut self) {
        self.schedule_renewal();
        // Deleting junk during recovery waits for a valid lease.
        if self.recovery.deleting_junk {
            self.delete_next();
        }
        if let Some(target) = self.lease.bump_to {
            if self.lease.held.is_some_and(|h| h.generation >= target) {
                self.lease.bump_to = None;
                self.after_rebuild();
            } else {
                self.try_bump();
            }
        }
    }

    fn schedule_renewal(&mut self) {
        let at = self.now + self.lease_cfg().renew_every;
        if !self.retries.values().any(|r| *r == Retry::LeaseRenew) {
            self.schedule(at, Retry::LeaseRenew);
        }
    }

    /// A commit landed while the lease may have lapsed: read the row (sent
    /// from now on) before applying it.
    pub(super) fn verify_commit(&mut self) {
        self.lease.verifying_commit = true;
        self.lease.verify_since = self.now;
        self.lease_read();
    }

    /// Raises the generation to `bump_to` once no other lease request is
    /// out (its answer comes back here through `lease_settled`).
    fn try_bump(&mut self) {
        let (Some(held), Some(target)) = (self.lease.held, self.lease.bump_to) else { return };
        if self.lease.busy {
            return;
        }
        let row = LeaseRow { generation: target, version: held.version + 1, ..held };
        self.lease_write(LeaseIntent::Bump, Some(held.version), row);
    }

    pub(super) fn renew_lease(&mut self) {
        let Some(held) = self.lease.held else { return };
        // While a read or write is out, its answer schedules the next renewal.
        if self.lease.releasing || self.lease.busy {
            return;
        }
        let row = LeaseRow { version: held.version + 1, ..held };
        self.lease_write(LeaseIntent::Renew, Some(held.version), row);
    }

    /// After the rebuild: the generation must exceed every epoch in the WAL.
    /// Returns false when a bump was sent and recovery waits for it.
    pub(super) fn lease_covers(&mut self, wal_generation: u64) -> bool {
        let Some(held) = self.lease.held else { return true };
        if held.generation > wal_generation {
            return true;
        }
        self.lease.bump_to = Some(wal_generation + 1);
        self.try_bump();
        false
    }

    /// Gives the lease up once a clean drain is complete. Returns true when
    /// there is nothing (more) to release.
    pub(super) fn release_lease(&mut self) -> bool {
        let Some(held) = self.lease.held else { return true };
        if self.lease.released {
            return true;
        }
        // After any renewal in flight, so the release does not race it, and
        // after any commit or delete in flight: once releasing, the writer
        // starts nothing more.
        let idle = self.wal.commit.is_none() && !self.wal.deleting && !self.wal.creating;
        if !self.lease.releasing && idle && !self.lease.busy && !self.retries.values().any(|r| *r == Retry::LeaseRead) {
            self.lease.releasing = true;
            let row = LeaseRow { holder: 0, version: held.version + 1, ..held };
            self.lease_write(LeaseIntent::Release, Some(held.version), row);
        }
        false
    }

    fn lease_cfg(&self) -> &LeaseConfig {
        self.cfg.lease.as_ref().expect("lease configured")
    }
}
