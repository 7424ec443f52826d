//! The WAL writer's group builder: which pending frames ride the next
//! commit group, whether it opens with a snapshot, and whether it seals its
//! segment. Part of the WAL writer: it works on the writer's own state.

use super::*;

/// What the snapshot of a new group is built from.
pub(in crate::host) struct SnapshotSource<'a> {
    pub(in crate::host) committed: &'a CommittedState,
    pub(in crate::host) names: &'a Names,
    /// The planted bug `snapshot-drops-frontier`.
    pub(in crate::host) drop_frontier: bool,
}

/// How a group is laid out in its segment.
struct Layout {
    segment: SegmentId,
    offset: u64,
    fresh: bool,
    /// What the group may fill before the seal reserve.
    room: u64,
}

impl WalWriter {
    /// Builds the next commit group from the pending frames and sends it.
    /// One group is in flight at a time; frames arriving meanwhile ride the
    /// next one. True when a group was sent.
    pub(in crate::host) fn start_commit(
        &mut self,
        fx: &mut Effects,
        limits: &Limits,
        snap: SnapshotSource<'_>,
    ) -> Result<bool, StopReason> {
        if self.commit.is_some() {
            return Ok(false);
        }
        let seal_due = self.active.as_ref().is_some_and(|a| a.seal_requested);
        if self.pending.is_empty() && !seal_due && !self.snapshot_wanted {
            return Ok(false);
        }
        let Some(at) = self.layout(fx.now, limits) else { return Ok(false) };
        let mut frames = Vec::new();
        let mut len = COMMIT_FRAME_BYTES as u64;
        let mut snapshot_acked = None;
        let mut seal_now = false;
        // A segment raft's fence opened is opened, for recovery, by the
        // writer's first group in it.
        let opens = at.fresh || self.head_open(at.segment);
        if opens || self.snapshot_wanted {
            self.snapshot_wanted = false;
            let snapshot = Frame::Snapshot(snap.committed.snapshot(snap.drop_frontier, snap.names));
            let snapshot_len = snapshot.encoded_len() as u64;
            if opens || len + snapshot_len <= at.room {
                len += snapshot_len;
                frames.push(snapshot);
                snapshot_acked = Some(snap.committed.acked.clone());
            } else {
                // No room here: seal, and the next segment opens with one,
                // at once (with sources paused at the WAL's size limit, no
                // other frame may come to open it).
                seal_now = true;
                self.snapshot_wanted = true;
            }
        }
        len = self.fill(&mut frames, len, at.room.min(limits.group_bytes_max.max(len)), &at, limits);
        seal_now |= self.must_seal(&at, &frames, len, limits)?;
        let full = at.offset + len + limits.group_bytes_max + SEAL_RESERVE > limits.segment_bytes;
        let only_snapshot = frames.iter().all(|f| matches!(f, Frame::Snapshot(_)));
        if at.fresh && full && only_snapshot && !self.pending.is_empty() {
            // Every segment would open with this snapshot and seal at once,
            // for ever: no segment of this size holds it and a group.
            return Err(StopReason::SegmentTooSmall {
                needed: at.offset + len + limits.group_bytes_max + SEAL_RESERVE,
            });
        }
        if seal_due || full || seal_now {
            self.seals_ahead += (full && !seal_due && !seal_now) as u64;
            self.seals_no_room += (seal_now && !seal_due) as u64;
            frames.push(Frame::Seal);
        }
        let lsn = self.next_lsn;
        let refs: Vec<&Frame> = frames.iter().collect();
        let bytes = Arc::new(encode_group(at.segment, self.epoch, lsn, &refs));
        let (segment, offset) = (at.segment, at.offset);
        self.commit = Some(InflightCommit { io: None, segment, offset, lsn, bytes, frames, snapshot_acked });
        self.send_commit(fx);
        Ok(true)
    }

    /// Where the next group goes, opening a spare if no segment is active.
    fn layout(&mut self, now: Instant, limits: &Limits) -> Option<Layout> {
        if self.active.is_none() {
            let id = self.spares.pop_front()?;
            let offset = SEGMENT_HEADER_BYTES as u64;
            self.active = Some(Active { id, offset, opened: now, seal_requested: false });
        }
        let active = self.active.as_ref().expect("set above");
        let offset = active.offset;
        // Saturating: a segment recovered under a larger WAL_BYTES_PER_FILE
        // may already be past this size; it still has room for a seal group,
        // which its writer always kept free.
        let room = limits.segment_bytes.saturating_sub(offset + SEAL_RESERVE);
        Some(Layout { segment: active.id, offset, fresh: offset == SEGMENT_HEADER_BYTES as u64, room })
    }

    /// Moves pending frames into the group while they fit `budget`. A frame
    /// larger than any group's budget (one large record) rides alone in a
    /// group of its own, where the segment's `room` holds it.
    fn fill(&mut self, frames: &mut Vec<Frame>, mut len: u64, budget: u64, at: &Layout, limits: &Limits) -> u64 {
        while let Some(frame) = self.pending.front() {
            let flen = frame.encoded_len() as u64;
            let oversized = flen + COMMIT_FRAME_BYTES as u64 > limits.group_bytes_max;
            let alone = oversized && frames.iter().all(|f| matches!(f, Frame::Snapshot(_))) && len + flen <= at.room;
            if len + flen > budget && !alone {
                break;
            }
            len += flen;
            self.pending_bytes -= flen;
            frames.push(self.pending.pop_front().expect("front exists"));
            if len > budget {
                break;
            }
        }
        len
    }

    /// Whether the group must seal its segment because the next pending
    /// frame does not fit after it, or an error if no segment of this size
    /// could ever hold what the group needs.
    fn must_seal(&self, at: &Layout, frames: &[Frame], len: u64, limits: &Limits) -> Result<bool, StopReason> {
        if at.fresh && len > at.room {
            return Err(StopReason::SegmentTooSmall { needed: len + at.offset + SEAL_RESERVE });
        }
        let next_len = self.pending.front().map(|f| f.encoded_len() as u64);
        let took_data = frames.iter().any(|f| !matches!(f, Frame::Snapshot(_)));
        let (false, Some(next_len)) = (took_data, next_len) else { return Ok(false) };
        if at.fresh && at.offset + len + next_len + SEAL_RESERVE > limits.segment_bytes {
            // Even an empty segment cannot hold its snapshot and the next
            // frame: more segments would not help.
            return Err(StopReason::SegmentTooSmall { needed: at.offset + len + next_len + SEAL_RESERVE });
        }
        // Not in what is left of this segment: seal, go on in the next.
        Ok(frames.is_empty())
    }
}
