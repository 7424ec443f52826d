//! What each request does: issued (latency drawn, a disk write reaching the
//! page cache), then performed at its completion time against the WAL
//! device, the lease row, the offsets store, or a plugin. The fault models
//! (`faults`) decide what goes wrong on the way.

use super::{Writer, LIVE};
use crate::rng::Die;
use crate::scenario::WalMode;
use crate::world::{self, World};
use skippr_core::{Input, IoError, IoId, IoOp, IoReply, OffsetEntry};
use skippr_core::{LeaseOp, OffsetsOp, PluginOp, WalOp};

impl World<Writer> {
    /// What happens when a request is issued: writes reach the page cache,
    /// and the completion is scheduled.
    pub(super) fn submit(&mut self, slot: usize, id: IoId, op: IoOp) {
        let gen = self.procs[slot].gen;
        let lat = &self.scenario.latencies;
        let (offsets, sink, source) = (lat.offsets, lat.sink, lat.source);
        match op {
            IoOp::Wal(op) => self.submit_wal(slot, gen, id, op),
            op @ (IoOp::Lease(_) | IoOp::Offsets(_)) => {
                self.after(Die::OffsetsLatency, offsets, world::Event::Complete { slot, gen, id, op })
            }
            IoOp::Plugin(PluginOp::SinkApply(apply)) => {
                let (die, sink) = self.sink_latency();
                self.after(die, sink, world::Event::SinkEffect { gen, id, apply, letters: false })
            }
            IoOp::Plugin(PluginOp::DeadLetters(apply)) => {
                self.after(Die::SinkLatency, sink, world::Event::SinkEffect { gen, id, apply, letters: true })
            }
            // Sources, the schema plugin, and a look at a sink's progress (not
            // a write: as quick as a source request).
            op @ IoOp::Plugin(_) => {
                self.after(Die::PluginLatency, source, world::Event::Complete { slot, gen, id, op })
            }
        }
    }

    fn submit_wal(&mut self, slot: usize, gen: u64, id: IoId, op: WalOp) {
        let lat = &self.scenario.latencies;
        let (s3_lat, disk_write, disk_other) = (lat.s3, lat.disk_write, lat.disk_other);
        let appending = matches!(op, WalOp::Append { .. });
        if self.scenario.wal == WalMode::S3 {
            if let WalOp::Sync = op {
                return self.after(
                    Die::S3Latency,
                    (10, 20),
                    world::Event::Complete { slot, gen, id, op: IoOp::Wal(op) },
                );
            }
            if appending && slot == LIVE {
                self.topo.append_in_flight = true;
            }
            let slow = self.fault(Die::S3Slow, self.scenario.faults.s3_slow);
            let (lo, hi) = s3_lat;
            // Never past the driver's operation timeout: what the lease's
            // argument rests on.
            let bound = self.scenario.lease.requests_within.as_micros().max(hi);
            let range = if slow { (hi, (hi * 20).min(bound)) } else { (lo, hi) };
            return self.after(Die::S3Latency, range, world::Event::Complete { slot, gen, id, op: IoOp::Wal(op) });
        }
        let latency = match op {
            WalOp::Append { .. } => {
                self.topo.append_in_flight = true;
                disk_write
            }
            // Recovery's windows are small and read in order: a device
            // serves each in microseconds, and a recovery of dozens of
            // them takes about what one request of another kind takes.
            WalOp::ReadAt { .. } => (5, 50),
            WalOp::Create { .. } if self.fault(Die::NoSpace, self.scenario.faults.no_space) => {
                self.stats.no_space += 1;
                let input = Input::IoDone { id, result: Err(IoError::NoSpace) };
                return self.after(Die::DiskLatency, disk_other, world::Event::Reply { gen, input });
            }
            _ => disk_other,
        };
        self.wals[0].issue(&op);
        self.after(Die::DiskLatency, latency, world::Event::Complete { slot, gen, id, op: IoOp::Wal(op) });
    }

    /// Performs a request at its completion time and returns its result.
    pub(super) fn complete(&mut self, slot: usize, gen: u64, op: IoOp) -> Result<IoReply, IoError> {
        match op {
            IoOp::Wal(op) => self.complete_wal(slot, gen, op),
            IoOp::Lease(LeaseOp::Read) => {
                if self.scenario.wal == WalMode::S3 && self.fault(Die::S3Throttle, self.scenario.faults.s3_throttle) {
                    self.stats.s3_throttled += 1;
                    return Err(IoError::Failed);
                }
                Ok(IoReply::Lease(self.topo.lease.row))
            }
            IoOp::Lease(LeaseOp::Write { expected, row }) => self.write_lease(expected, row),
            IoOp::Offsets(OffsetsOp::Read) => Ok(IoReply::Offsets(self.stores[0].read())),
            IoOp::Offsets(OffsetsOp::Write { entries }) => self.write_offsets_request(entries),
            // A woken writer resumes from what it recovered before it froze:
            // stale, and harmless while it cannot commit.
            IoOp::Plugin(op) => self.complete_plugin(slot, op, (slot == LIVE).then_some(0)),
        }
    }

    fn complete_wal(&mut self, slot: usize, gen: u64, op: WalOp) -> Result<IoReply, IoError> {
        let s3 = self.scenario.wal == WalMode::S3;
        let f = &self.scenario.faults;
        let (fsync_fail, s3_throttle) = (f.fsync_fail, f.s3_throttle);
        if matches!(op, WalOp::Append { .. }) && (slot == LIVE || !s3) {
            self.topo.append_in_flight = false;
        }
        let fails = match op {
            WalOp::Sync | WalOp::Create { .. } | WalOp::Append { .. } if !s3 => self.fault(Die::FsyncFail, fsync_fail),
            WalOp::List | WalOp::ReadAt { .. } if s3 => {
                let throttled = self.fault(Die::S3Throttle, s3_throttle);
                self.stats.s3_throttled += throttled as u64;
                if matches!(op, WalOp::ReadAt { .. }) {
                    self.stats.recovery_reads += 1;
                    self.stats.recovery_read_fails += throttled as u64;
                }
                throttled
            }
            WalOp::ReadAt { .. } => {
                // A recovery reads dozens of windows: each fails at a tenth
                // of a read-back's rate, so that most recoveries meet one
                // failure at most.
                self.stats.recovery_reads += 1;
                let failed = self.fault(Die::ReadFail, self.scenario.faults.read_fail / 10.0);
                self.stats.recovery_read_fails += failed as u64;
                failed
            }
            WalOp::Create { .. } | WalOp::Append { .. } if s3 => return self.put_to_s3(gen, op),
            WalOp::ReadGroups { .. } => {
                self.stats.read_backs += 1;
                let failed = self.fault(Die::ReadFail, self.scenario.faults.read_fail);
                self.stats.read_fails += failed as u64;
                failed
            }
            WalOp::Delete { .. } => {
                self.stats.segments_deleted += 1;
                false
            }
            WalOp::WriteStopRecord(_) => {
                let failed =
                    if s3 { self.fault(Die::S3Throttle, s3_throttle) } else { self.fault(Die::FsyncFail, fsync_fail) };
                self.stats.stop_records_written += !failed as u64;
                failed
            }
            WalOp::ReadStopRecord if s3 => self.fault(Die::S3Throttle, s3_throttle),
            WalOp::ReadStopRecord => self.fault(Die::ReadFail, self.scenario.faults.read_fail / 10.0),
            _ => false,
        };
        self.wals[0].perform(gen, op, fails)
    }

    /// The offsets store applies a write; the checker hears of each change.
    pub(super) fn write_offsets(&mut self, entries: &[OffsetEntry]) {
        for (key, old, new) in self.stores[0].write(entries) {
            self.checker.on_offsets_changed(key, old, new);
        }
    }
}
