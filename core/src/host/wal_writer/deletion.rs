//! The WAL writer's deletion queue: the deletion rule that queues sealed
//! segments once a snapshot commits past them and every sink acknowledged
//! their records, the snapshot asked for when the WAL is full, and the
//! deletions sent one at a time. Part of the WAL writer: it works on the
//! writer's own state.

use super::*;

impl WalWriter {
    /// The WAL just reached its size limit: with nothing else on its way to
    /// free space and the oldest segment compacted, a snapshot lets it go.
    /// (After a restart with everything acknowledged, no compaction is left
    /// to ask for one; from here on, each acknowledgement that compacts the
    /// oldest segment does.)
    pub(in crate::host) fn make_room(&mut self, acked: &Acked, sinks: u16) {
        let snapshot_on_its_way =
            self.snapshot_wanted || self.commit.as_ref().is_some_and(|c| c.snapshot_acked.is_some());
        if !snapshot_on_its_way && self.deletes.is_empty() && self.oldest_segment_compacted(acked, sinks) {
            self.snapshot_wanted = true;
        }
    }

    /// Every record of the oldest sealed segment is below every sink's
    /// acknowledged position in `acked`.
    pub(in crate::host) fn oldest_segment_compacted(&self, acked: &Acked, sinks: u16) -> bool {
        self.segments.front().is_some_and(|seg| {
            seg.sealed
                && seg
                    .ends
                    .iter()
                    .all(|(key, end)| (0..sinks).all(|s| acked.get(&(SinkId(s), *key)).is_some_and(|a| a >= end)))
        })
    }

    /// The source whose open window holds records in the oldest segment,
    /// if any: records past its partition's committed position.
    pub(in crate::host) fn oldest_holds_window(&self, committed: &CommittedState) -> Option<SourceId> {
        let seg = self.segments.front()?;
        let position = |key: &PartitionKey| committed.partitions.get(key).map_or(Position(0), |p| p.position);
        seg.ends
            .iter()
            .find(|(key, end)| committed.windows.contains_key(&key.source) && position(key) < **end)
            .map(|(key, _)| key.source)
    }

    /// The deletion rule, evaluated when a snapshot commits at `lsn`.
    /// `ignore_acks` is the planted bug `delete-before-compaction-ack`.
    pub(in crate::host) fn plan_deletions(&mut self, lsn: Lsn, acked: &Acked, sinks: u16, ignore_acks: bool) {
        while let Some(seg) = self.segments.front() {
            if !seg.sealed || seg.last_lsn >= lsn {
                break;
            }
            if !self.oldest_segment_compacted(acked, sinks) && !ignore_acks {
                break;
            }
            // Clustered mode: the segment left first must open with a
            // snapshot, or recovery could not start from it.
            let next_head = self.segments.get(1).map(|s| s.head);
            if self.replicated && next_head != Some(crate::recovery::Head::Snapshot) {
                break;
            }
            let seg = self.segments.pop_front().expect("front exists");
            self.deletes.push_back(seg.id);
            self.deletes_justified_at = lsn;
        }
    }

    /// Queues segments recovery found past the WAL's end.
    pub(in crate::host) fn delete_junk(&mut self, junk: Vec<SegmentId>) {
        self.deletes.extend(junk);
    }

    /// The planted bug `delete-during-recovery`: the oldest sealed segment
    /// goes first, compacted or not.
    pub(in crate::host) fn delete_oldest_now(&mut self) {
        if let Some(seg) = self.segments.front().filter(|s| s.sealed) {
            self.deletes.push_front(seg.id);
            self.segments.pop_front();
        }
    }

    pub(in crate::host) fn deletes_queued(&self) -> bool {
        !self.deletes.is_empty()
    }

    /// The segment the next deletion would delete, if one may start, and
    /// the LSN the commit that queued it must be saved through.
    pub(in crate::host) fn next_delete(&self) -> Option<(SegmentId, Lsn)> {
        self.deletes.front().map(|&s| (s, self.deletes_justified_at)).filter(|_| !self.deleting)
    }

    /// Sends the oldest queued deletion, one at a time. A writer that may
    /// have lost its authority deletes nothing: a newer writer may be
    /// reading these segments.
    /// (Clustered mode: `may_write` says raft's log starts after the
    /// segment.)
    pub(in crate::host) fn delete_next(&mut self, fx: &mut Effects, may_write: bool) {
        if self.deleting || !may_write {
            return;
        }
        if let Some(&segment) = self.deletes.front() {
            self.deleting = true;
            fx.io(Pending::WalDelete(segment), IoOp::Wal(WalOp::Delete { segment }));
        }
    }

    /// A deletion finished. True when it succeeded.
    pub(in crate::host) fn on_deleted(&mut self, fx: &mut Effects, segment: SegmentId, ok: bool) -> bool {
        if !ok {
            fx.retry_later(Retry::Delete);
            return false;
        }
        fx.succeeded(Retry::Delete);
        assert_eq!(self.deletes.pop_front(), Some(segment), "deletes go in order");
        self.deleting = false;
        true
    }

    pub(in crate::host) fn retry_delete(&mut self) {
        self.deleting = false;
    }
}
