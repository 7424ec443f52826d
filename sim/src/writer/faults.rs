//! The fault models: what goes wrong with a request as it is performed
//! (a put, a lease write or an offsets write whose outcome is unknown and
//! that takes effect now, later or never; a sink that asks for a retry or
//! whose reply is lost), and what the requests of a process that died still
//! do on their way. Each fault kind draws from its own die; faults happen
//! only in the fault phase.

use super::{Event, Writer, LIVE};
use crate::rng::Die;
use crate::scenario::WalMode;
use crate::world::{self, World};
use skippr_core::{IoError, IoOp, IoReply, LeaseRow, OffsetEntry};
use skippr_core::{LeaseOp, OffsetsOp, WalOp};
use std::sync::Arc;

impl World<Writer> {
    /// A WAL put against S3 at completion: refused, unknown (the effect now,
    /// later or never), or performed.
    pub(super) fn put_to_s3(&mut self, gen: u64, op: WalOp) -> Result<IoReply, IoError> {
        let f = &self.scenario.faults;
        let (throttle, unknown) = (f.s3_throttle, f.s3_ambiguous);
        if self.fault(Die::S3Throttle, throttle) {
            self.stats.s3_throttled += 1;
            return self.wals[0].perform(gen, op, true);
        }
        if self.fault(Die::S3Ambiguous, unknown) {
            return self.put_outcome_unknown(gen, op);
        }
        self.wals[0].perform(gen, op, false)
    }

    /// The put's reply is lost: it took effect, will take effect later (no
    /// later than the driver's operation timeout), or never will.
    fn put_outcome_unknown(&mut self, gen: u64, op: WalOp) -> Result<IoReply, IoError> {
        let (segment, offset, bytes) = match op {
            WalOp::Create { segment, header, .. } => (segment, 0, Arc::new(header)),
            WalOp::Append { segment, offset, bytes, .. } => (segment, offset, bytes),
            _ => unreachable!("only creates and appends put"),
        };
        let s3 = self.wals[0].s3_mut().expect("S3 mode");
        let conditional = s3.conditional(gen, segment, offset);
        s3.outcome_unknown(gen, segment, offset);
        self.stats.s3_ambiguous += 1;
        if self.owner(gen) == Some(LIVE) && self.dice.roll(Die::Pause).chance(self.scenario.faults.pause / 2.0) {
            // The reply was lost because the writer's network went down: it
            // is cut off, and a replacement takes over.
            self.at(self.now(), world::Event::Topo(Event::Freeze));
        }
        let roll = self.dice.roll(Die::S3Ambiguous).range(0, 99);
        if roll < 40 {
            let _ = self.wals[0].s3_mut().expect("S3 mode").put(conditional, segment, offset, &bytes);
        } else if roll < 70 {
            let late = self.scenario.lease.requests_within.as_micros();
            self.after_topo(Die::S3Ambiguous, (1_000, late), Event::S3Land { conditional, segment, offset, bytes });
        }
        Err(IoError::Ambiguous)
    }

    /// A conditional write of the lease row; its outcome may be unknown.
    pub(super) fn write_lease(&mut self, expected: Option<u64>, row: LeaseRow) -> Result<IoReply, IoError> {
        if self.fault(Die::LeaseAmbiguous, self.scenario.faults.lease_ambiguous) {
            let roll = self.dice.roll(Die::LeaseAmbiguous).range(0, 99);
            if roll < 40 {
                let _ = self.topo.lease.write(expected, row);
            } else if roll < 70 {
                let late = self.scenario.lease.steal_after.as_micros() * 2;
                self.after_topo(Die::LeaseAmbiguous, (1_000, late), Event::LeaseLand { expected, row });
            }
            return Err(IoError::Ambiguous);
        }
        self.topo.lease.write(expected, row).map(|()| IoReply::Done)
    }

    /// An offsets write; its outcome may be unknown, and DynamoDB may apply
    /// a timed-out write later, after newer ones.
    pub(super) fn write_offsets_request(&mut self, entries: Vec<OffsetEntry>) -> Result<IoReply, IoError> {
        if self.fault(Die::OffsetsAmbiguous, self.scenario.faults.offsets_ambiguous) {
            self.stats.offsets_ambiguous += 1;
            if self.dice.roll(Die::InFlight).chance(0.5) {
                self.write_offsets(&entries);
            } else if self.scenario.wal == WalMode::S3 && self.dice.roll(Die::InFlight).chance(0.5) {
                let late = self.scenario.lease.steal_after.as_micros() * 2;
                self.after_topo(Die::OffsetsAmbiguous, (1_000, late), Event::OffsetsLand { entries });
            }
            return Err(IoError::Ambiguous);
        }
        self.write_offsets(&entries);
        Ok(IoReply::Done)
    }

    /// A request that left before its process died: the service may still
    /// act on it (half of the time), and nobody hears the answer.
    pub(super) fn in_flight_effect(&mut self, gen: u64, op: IoOp) {
        let s3 = self.scenario.wal == WalMode::S3;
        let put = match op {
            IoOp::Offsets(OffsetsOp::Write { entries }) => {
                if self.dice.roll(Die::InFlight).chance(0.5) {
                    self.write_offsets(&entries);
                }
                return;
            }
            IoOp::Lease(LeaseOp::Write { expected, row }) => {
                if self.dice.roll(Die::InFlight).chance(0.5) {
                    let _ = self.topo.lease.write(expected, row);
                }
                return;
            }
            IoOp::Wal(WalOp::Append { segment, offset, bytes, .. }) if s3 => (segment, offset, bytes),
            IoOp::Wal(WalOp::Create { segment, header, .. }) if s3 => (segment, 0, Arc::new(header)),
            _ => return,
        };
        if self.dice.roll(Die::InFlight).chance(0.5) {
            let (segment, offset, bytes) = put;
            let s3 = self.wals[0].s3_mut().expect("S3 mode");
            let conditional = s3.conditional(gen, segment, offset);
            let _ = s3.put(conditional, segment, offset, &bytes);
        }
    }
}
