//! The coordinator's side of a commit: an append's answer, the writer
//! authority's verdict on a group that landed while it may have lapsed, and
//! what each frame of a landed group means for the parts that react to it
//! (sources are acked, offsets marked, records held, plans dispatched,
//! deletions planned). Owns no state.

use super::*;
use crate::wal::{Frame, GroupPlace};
use wal_writer::Appended;

impl Host {
    pub(super) fn on_append(&mut self, id: IoId, result: Result<(), IoError>) {
        let stale_commits = self.cfg.mutations.has(Mutation::StaleWriterCommits);
        match self.wal.on_append(&mut self.fx, id, result, stale_commits) {
            Appended::Durable => {}
            Appended::Again => return,
            Appended::Failed(stop) => return self.stop(stop),
        }
        if !self.may_write() && !stale_commits {
            // The put landed, but the lease may have lapsed meanwhile: a newer
            // writer may have deleted this segment, freeing the key. Only a
            // row still ours proves the group is in the WAL.
            return self.authority.held_lease().verify_commit(&mut self.fx);
        }
        self.commit_landed();
    }

    /// The group in flight is durable and visible: apply it.
    pub(super) fn commit_landed(&mut self) {
        let landed = self.wal.land(&mut self.fx);
        // A void window moves sinks past it too (seed 12953 of version 29:
        // at the WAL's limit, no snapshot was asked for after one did, and
        // nothing moved again).
        let acks_advanced = landed.frames.iter().any(|f| {
            matches!(f, Frame::CompactionDone(_) | Frame::BatchSkipped(_)) || matches!(f, Frame::Window(x) if !x.closed)
        });
        let fenced = landed.frames.iter().any(|f| matches!(f, Frame::Fence));
        let lsn = landed.place.lsn;
        for frame in landed.frames {
            self.committed.apply(lsn, &frame);
            self.on_committed(landed.place, frame);
        }
        let sinks = self.cfg.sinks.len() as u16;
        if let Some(acked) = landed.snapshot_acked {
            let ignore_acks = self.cfg.mutations.has(Mutation::DeleteBeforeCompactionAck);
            self.wal.plan_deletions(lsn, &acked, sinks, ignore_acks);
        }
        if acks_advanced && self.wal.oldest_segment_compacted(&self.committed.acked, sinks) {
            self.wal.want_snapshot();
        }
        if fenced && self.phase == Phase::Recovering {
            self.fenced();
        }
    }

    /// The live effects of a frame that just became committed.
    fn on_committed(&mut self, place: GroupPlace, frame: Frame) {
        match frame {
            Frame::SourceBatch(b) if b.provisional => self.records.push_provisional(b.key, place, b.records),
            Frame::SourceBatch(b) => {
                self.sources.committed(b.key, b.end);
                let keep_first = self.cfg.mutations.has(Mutation::OffsetsStaleValue);
                self.offsets.committed(b.key, &self.committed.partitions[&b.key], keep_first);
                self.records.push(b.key, place, b.records);
                self.compaction.records_committed();
            }
            Frame::CompactionPlanned(plan) => {
                let ready = self.compaction.plan_committed(&plan);
                if ready {
                    self.dispatch(plan.sink, plan.stream);
                }
            }
            Frame::CompactionDone(done) => self.prune_acked(done.stream),
            Frame::BatchSkipped(k) => self.prune_acked(k.stream),
            Frame::Refused(r) if self.compaction.decision_committed(r.sink, r.stream) => {
                self.dispatch(r.sink, r.stream);
            }
            Frame::Split(x) => {
                let (sink, stream, seq, id) = (x.sink, x.stream, x.seq, x.then);
                self.fx.emit(Output::Split { sink, stream, seq, id });
                if self.compaction.decision_committed(sink, stream) {
                    self.dispatch(sink, stream);
                }
            }
            Frame::Settled(x) => {
                if let Some(letters) = x.letters {
                    let slot = (x.sink, x.stream);
                    let standing = x.standing(self.committed.refusals_of(slot)).iter();
                    let mut reasons: Vec<String> =
                        standing.flat_map(|r| r.records.iter().map(|x| x.reason.clone())).collect();
                    let at_intake = crate::dead_letters::AT_INTAKE;
                    reasons.extend((0..x.quarantined).map(|_| at_intake.to_string()));
                    let (sink, stream, seq) = (x.sink, x.stream, x.seq);
                    self.fx.emit(Output::Refused { sink, stream, seq, letters, reasons });
                }
                if self.compaction.decision_committed(x.sink, x.stream) {
                    self.dispatch(x.sink, x.stream);
                }
            }
            Frame::Window(x) => {
                for t in x.tails.iter().filter(|t| t.more) {
                    let (source, partition, kept) = (x.source, t.partition, t.digests.len());
                    self.fx.emit(Output::TailCut { source, partition, kept });
                }
                // Its partitions moved: the source learns where too.
                self.window_ended(&x);
                for part in &x.parts {
                    self.sources.committed(PartitionKey { source: x.source, partition: part.partition }, part.to);
                }
                self.compaction.records_committed();
            }
            Frame::Skipped(k) => {
                // Where it moved the partition on, the source and the
                // offsets store learn the new position.
                if let Some(p) = self.committed.partitions.get(&k.key).filter(|p| p.lsn == place.lsn) {
                    self.sources.committed(k.key, p.position);
                    self.offsets.committed(k.key, p, false);
                }
            }
            _ => {}
        }
    }

    /// A window's end committed, on any host: its records settle or are
    /// dropped (void), the offsets store learns where its partitions
    /// moved, and a void one's sinks, moved past it, hold no records of it.
    pub(super) fn window_ended(&mut self, x: &crate::wal::WindowEnd) {
        self.records.window_ended(x);
        for part in &x.parts {
            let key = PartitionKey { source: x.source, partition: part.partition };
            self.offsets.committed(key, &self.committed.partitions[&key], false);
        }
        if !x.closed {
            let streams: std::collections::BTreeSet<StreamId> = x.parts.iter().map(|p| p.stream).collect();
            for stream in streams {
                self.prune_acked(stream);
            }
        }
    }

    /// A sink acknowledged a batch of `stream`: the records every sink has
    /// acknowledged are no longer held.
    pub(super) fn prune_acked(&mut self, stream: StreamId) {
        let sinks = self.cfg.sinks.len() as u16;
        for (key, p) in &self.committed.partitions {
            if p.stream == stream {
                let floor = (0..sinks).map(|s| self.committed.acked(SinkId(s), *key)).min();
                self.records.prune(*key, floor.unwrap_or_default());
            }
        }
    }
}
