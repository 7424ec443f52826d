//! Group commit and the segment lifecycle: building commit groups from the
//! pending frames, one in flight at a time; applying them once durable;
//! creating segments ahead of need, sealing, snapshots and deletion.

use super::*;

impl Host {
    pub(super) fn segment_age_deadline(&self) -> Option<Instant> {
        let a = self.wal.active.as_ref()?;
        if a.seal_requested || a.offset == SEGMENT_HEADER_BYTES as u64 {
            return None;
        }
        Some(a.opened + self.cfg.limits.segment_age_max)
    }

    pub(super) fn ensure_spare(&mut self) {
        let enough = self.wal.spares.len() >= self.cfg.limits.spare_segments as usize;
        if self.wal.creating || enough || !self.lease_ok() {
            return;
        }
        // The id advances only when the creation succeeds: a failed one is
        // retried under the same id, so no half-created segment is ever left
        // behind a newer one.
        let segment = self.wal.next_segment;
        self.wal.creating = true;
        let header = encode_header(segment, self.wal.epoch);
        self.io(Pending::WalCreate(segment), IoOp::WalCreate { segment, header });
    }

    /// Builds the next commit group from the pending frames and sends it.
    /// One group is in flight at a time; frames arriving meanwhile ride the
    /// next one.
    pub(super) fn start_commit(&mut self) {
        if self.wal.commit.is_some() || !self.lease_ok() {
            return;
        }
        let seal_due = self.wal.active.as_ref().is_some_and(|a| a.seal_requested);
        if self.pending.is_empty() && !seal_due && !self.wal.snapshot_wanted {
            return;
        }
        if self.wal.active.is_none() {
            let Some(id) = self.wal.spares.pop_front() else { return };
            let offset = SEGMENT_HEADER_BYTES as u64;
            self.wal.active = Some(Active { id, offset, opened: self.now, seal_requested: false });
        }
        let limits = &self.cfg.limits;
        let active = self.wal.active.as_ref().expect("set above");
        let (segment, offset) = (active.id, active.offset);
        let fresh = offset == SEGMENT_HEADER_BYTES as u64;
        // Saturating: a segment recovered under a larger WAL_BYTES_PER_FILE
        // may already be past this size; it still has room for a seal group,
        // which its writer always kept free.
        let room = limits.segment_bytes.saturating_sub(offset + SEAL_RESERVE);
        let mut frames = Vec::new();
        let mut len = COMMIT_FRAME_BYTES as u64;
        let mut snapshot_acked = None;
        let mut seal_now = false;
        if fresh || self.wal.snapshot_wanted {
            self.wal.snapshot_wanted = false;
            let drop = self.cfg.mutations.has(Mutation::SnapshotDropsFrontier);
            let snapshot = Frame::Snapshot(self.committed.snapshot(drop, &self.names));
            let snapshot_len = snapshot.encoded_len() as u64;
            if fresh || len + snapshot_len <= room {
                len += snapshot_len;
                frames.push(snapshot);
                snapshot_acked = Some(self.committed.acked.clone());
            } else {
                // No room here: seal, and the next segment opens with one.
                seal_now = true;
            }
        }
        let budget = room.min(limits.group_bytes_max.max(len));
        while let Some(frame) = self.pending.front() {
            let flen = frame.encoded_len() as u64;
            if len + flen > budget {
                break;
            }
            len += flen;
            self.pending_bytes -= flen;
            frames.push(self.pending.pop_front().expect("front exists"));
        }
        if fresh && len > room {
            return self.stop(StopReason::SegmentTooSmall { needed: len + offset + SEAL_RESERVE });
        }
        let next_len = self.pending.front().map(|f| f.encoded_len() as u64);
        let took_data = frames.iter().any(|f| !matches!(f, Frame::Snapshot(_)));
        if let (false, Some(next_len)) = (took_data, next_len) {
            if fresh && offset + len + next_len + SEAL_RESERVE > limits.segment_bytes {
                // Even an empty segment cannot hold its snapshot and the
                // next frame: more segments would not help.
                return self.stop(StopReason::SegmentTooSmall { needed: offset + len + next_len + SEAL_RESERVE });
            }
            if frames.is_empty() {
                // Not in what is left of this segment: seal, go on in the next.
                seal_now = true;
            }
        }
        let full = offset + len + limits.group_bytes_max + SEAL_RESERVE > limits.segment_bytes;
        if seal_due || full || seal_now {
            frames.push(Frame::Seal);
        }
        let lsn = self.wal.next_lsn;
        let refs: Vec<&Frame> = frames.iter().collect();
        let bytes = Arc::new(encode_group(segment, self.wal.epoch, lsn, &refs));
        let dispatch_early = self.cfg.mutations.has(Mutation::DispatchBeforePlanCommit);
        self.wal.commit = Some(InflightCommit { io: None, segment, offset, lsn, bytes, frames, snapshot_acked });
        self.send_commit();
        if dispatch_early {
            self.dispatch_planned_in_flight();
        }
    }

    pub(super) fn send_commit(&mut self) {
        let c = self.wal.commit.as_ref().expect("a commit is in flight");
        let op = IoOp::WalAppend { segment: c.segment, offset: c.offset, lsn: c.lsn, bytes: c.bytes.clone() };
        let id = self.io(Pending::WalAppend, op);
        self.wal.commit.as_mut().expect("in flight").io = Some(id);
    }

    pub(super) fn on_append(&mut self, id: IoId, result: Result<IoReply, IoError>) {
        let c = self.wal.commit.as_ref().expect("an append answers the commit in flight");
        assert_eq!(c.io, Some(id), "one append in flight");
        match result {
            Ok(_) => {}
            Err(IoError::Ambiguous) => {
                // The group may or may not be there: send the identical bytes
                // again until the outcome is known.
                self.wal.commit.as_mut().expect("in flight").io = None;
                return self.retry_later(Retry::Commit);
            }
            Err(IoError::Conflict) if self.cfg.mutations.has(Mutation::StaleWriterCommits) => {}
            Err(IoError::Conflict) => {
                let (segment, offset) = (c.segment, c.offset);
                return self.stop(StopReason::Fenced { segment, offset });
            }
            Err(error) => {
                let segment = c.segment;
                return self.stop(StopReason::WalWriteFailed { segment, error });
            }
        }
        self.wal.commit.as_mut().expect("in flight").io = None;
        if !self.lease_ok() && !self.cfg.mutations.has(Mutation::StaleWriterCommits) {
            // The put landed, but the lease may have lapsed meanwhile: a newer
            // writer may have deleted this segment, freeing the key. Only a
            // row still ours proves the group is in the WAL.
            return self.verify_commit();
        }
        self.commit_landed();
    }

    /// The group in flight is durable and visible: apply it.
    pub(super) fn commit_landed(&mut self) {
        self.succeeded(Retry::Commit);
        let c = self.wal.commit.take().expect("in flight");
        let active = self.wal.active.as_mut().expect("a commit goes to the active segment");
        active.offset += c.bytes.len() as u64;
        if self.wal.segments.back().is_none_or(|s| s.id != c.segment) {
            self.wal.segments.push_back(SegmentSummary::new(c.segment, c.lsn));
        }
        let sealed = matches!(c.frames.last(), Some(Frame::Seal));
        let acks_advanced = c.frames.iter().any(|f| matches!(f, Frame::CompactionDone(_)));
        let fenced = c.frames.iter().any(|f| matches!(f, Frame::Fence));
        for frame in c.frames {
            self.committed.apply(c.lsn, &frame);
            self.wal.segments.back_mut().expect("pushed above").note(c.lsn, &frame);
            self.on_committed(frame);
        }
        self.wal.next_lsn = Lsn(c.lsn.0 + 1);
        if sealed {
            self.wal.active = None;
        }
        if let Some(acked) = c.snapshot_acked {
            self.plan_deletions(c.lsn, &acked);
        }
        if acks_advanced && self.oldest_segment_compacted(&self.committed.acked) {
            self.wal.snapshot_wanted = true;
        }
        if fenced && self.phase == Phase::Recovering {
            self.recovery.fencing = false;
            self.io(Pending::OffsetsRead, IoOp::OffsetsRead);
        }
    }

    /// Every record of the oldest sealed segment is below every sink's
    /// acknowledged position in `acked`.
    pub(super) fn oldest_segment_compacted(&self, acked: &BTreeMap<(SinkId, PartitionKey), Position>) -> bool {
        let sinks = self.cfg.sinks.len() as u16;
        self.wal.segments.front().is_some_and(|seg| {
            seg.sealed
                && seg
                    .ends
                    .iter()
                    .all(|(key, end)| (0..sinks).all(|s| acked.get(&(SinkId(s), *key)).is_some_and(|a| a >= end)))
        })
    }

    /// The live effects of a frame that just became committed.
    pub(super) fn on_committed(&mut self, frame: Frame) {
        match frame {
            Frame::SourceBatch(b) => {
                self.sources[b.key.source.0 as usize].acks.insert(b.key.partition, b.end);
                self.offsets_dirty.insert(b.key);
                if self.cfg.mutations.has(Mutation::OffsetsStaleValue) {
                    let p = &self.committed.partitions[&b.key];
                    let value = OffsetValue { position: p.position, lsn: p.lsn, records: p.records };
                    self.offsets_stale.entry(b.key).or_insert(value);
                }
                self.records.push(b.key, b.records);
            }
            Frame::CompactionPlanned(plan) => {
                let key = (plan.sink, plan.stream);
                if let Some(Slot::Planned { plan: p, committed, .. }) = self.slots.get_mut(&key) {
                    if p.id == plan.id {
                        *committed = true;
                        self.dispatch(key.0, key.1);
                    }
                }
            }
            Frame::CompactionDone(done) => {
                let sinks = self.cfg.sinks.len() as u16;
                let keys: Vec<PartitionKey> = self
                    .committed
                    .partitions
                    .iter()
                    .filter(|(_, p)| p.stream == done.stream)
                    .map(|(k, _)| *k)
                    .collect();
                for key in keys {
                    let floor = (0..sinks).map(|s| self.committed.acked(SinkId(s), key)).min();
                    self.records.prune(key, floor.unwrap_or_default());
                }
            }
            _ => {}
        }
    }

    /// The deletion rule, evaluated when a snapshot commits at `lsn`.
    pub(super) fn plan_deletions(&mut self, lsn: Lsn, acked: &BTreeMap<(SinkId, PartitionKey), Position>) {
        let ignore_acks = self.cfg.mutations.has(Mutation::DeleteBeforeCompactionAck);
        while let Some(seg) = self.wal.segments.front() {
            if !seg.sealed || seg.last_lsn >= lsn {
                break;
            }
            if !self.oldest_segment_compacted(acked) && !ignore_acks {
                break;
            }
            let seg = self.wal.segments.pop_front().expect("front exists");
            self.wal.deletes.push_back(seg.id);
        }
    }

    pub(super) fn delete_next(&mut self) {
        // A writer that may have lost the lease deletes nothing: a newer
        // writer may be reading these segments.
        if self.wal.deleting || !self.lease_ok() {
            return;
        }
        if let Some(&segment) = self.wal.deletes.front() {
            self.wal.deleting = true;
            self.io(Pending::WalDelete(segment), IoOp::WalDelete { segment });
        }
    }
}
