//! Part of `Log`: the log a host finds on its disk at start, built a group
//! at a time as recovery's streaming scan admits them, so that the WAL is
//! never held whole. From its first group on (genesis, or the first after
//! deleted segments: raft's log starts after it), each group's end and term
//! are kept, the groups past raft's commit index with their bytes (raft-rs
//! holds them as entries until it commits or truncates them).
//!
//! Every group on disk up to the first one is committed (segments go only
//! once a committed snapshot after them is applied), so a saved commit
//! index below it, left by a crash between a deletion or install and the
//! next save, is raised to it. A commit index past the last durable group
//! means acknowledged data is gone: the host must not take part (it could
//! vote for a log that lacks it).

use super::*;
use crate::wal::stream::Scanned;
use crate::wal::SEGMENT_HEADER_BYTES;

/// The commit index a restore starts from: the one saved, raised to the
/// first group on disk (every group up to it is committed: see above). The
/// one place this rule lives; the scan's rebuild, the log, and a stop
/// record's check all ask here.
pub fn commit_on_disk(saved: u64, first_group: u64) -> u64 {
    saved.max(first_group)
}

/// A group the scan admitted, held until the next group or its segment's
/// end says whether it sealed its segment.
#[derive(Clone, Copy)]
struct Admitted {
    segment: SegmentId,
    lsn: Lsn,
    epoch: Epoch,
    offset: u64,
    end: u64,
}

pub struct LogBuilder {
    hard: HardState,
    conf: ConfState,
    /// Each segment file's length, from the listing.
    sizes: BTreeMap<SegmentId, u64>,
    log: Option<Log>,
    newest: Option<Admitted>,
    /// A group after the first opened the segment being scanned: its
    /// header epoch is noted at the segment's end.
    opened: bool,
    /// The bytes of groups past the saved commit index, by LSN.
    tail: Vec<(u64, Vec<u8>)>,
    error: Option<RestoreError>,
}

impl LogBuilder {
    /// A builder for the log of the segments listed with `sizes`, under the
    /// hard state and membership saved last.
    pub fn new(hard: HardState, conf: ConfState, sizes: BTreeMap<SegmentId, u64>) -> LogBuilder {
        LogBuilder { hard, conf, sizes, log: None, newest: None, opened: false, tail: Vec::new(), error: None }
    }

    /// The saved commit index: recovery folds groups in through it (raised
    /// to the first group on disk, as here).
    pub fn saved_commit(&self) -> Lsn {
        Lsn(self.hard.commit)
    }

    /// What the scan hands out, in WAL order (the bytes of a group past
    /// the commit index taken, not copied).
    pub fn see(&mut self, item: &mut Scanned) {
        match item {
            Scanned::Group(segment, g) => {
                self.group(Admitted { segment: *segment, lsn: g.lsn, epoch: g.epoch, offset: g.offset, end: g.end })
            }
            Scanned::Bytes(bytes) => self.bytes(std::mem::take(bytes)),
            Scanned::Segment(seg) => self.segment_done(seg.id, seg.header_epoch, seg.sealed),
        }
    }

    fn group(&mut self, g: Admitted) {
        // The one before is not its segment's last.
        if let Some(before) = self.newest.replace(g) {
            self.place(before, false);
        }
    }

    /// The bytes of the group seen last.
    fn bytes(&mut self, bytes: Vec<u8>) {
        let lsn = self.newest.expect("bytes follow their group").lsn;
        self.tail.push((lsn.0, bytes));
    }

    fn segment_done(&mut self, id: SegmentId, header_epoch: Option<Epoch>, sealed: bool) {
        if let Some(last) = self.newest.take() {
            assert_eq!(last.segment, id, "a segment is handed out after its groups");
            self.place(last, sealed);
        }
        if let (Some(log), Some(epoch), true) = (&mut self.log, header_epoch, std::mem::take(&mut self.opened)) {
            log.header_epochs.insert(id, epoch);
        }
    }

    fn place(&mut self, g: Admitted, sealed: bool) {
        if self.error.is_some() {
            return;
        }
        let segment_bytes = self.sizes.get(&g.segment).copied().unwrap_or(0);
        let end = LogEnd { lsn: g.lsn, segment: g.segment, end: g.end, sealed, segment_bytes };
        let Some(log) = &mut self.log else {
            if g.lsn == Lsn(0) && g.segment != SegmentId(0) {
                self.error = Some(RestoreError::NoGenesis);
                return;
            }
            let mut hard = self.hard.clone();
            hard.commit = commit_on_disk(hard.commit, g.lsn.0);
            self.log = Some(Log::new(hard, self.conf.clone(), (g.lsn.0, g.epoch.0), end));
            return;
        };
        self.opened |= g.offset == SEGMENT_HEADER_BYTES as u64;
        log.ends.push_back(end);
        log.terms.push(g.lsn.0, g.epoch.0);
    }

    /// The log, once every listed segment is scanned; `None` on a host's
    /// first start (no hard state saved and no group on disk: its WAL is
    /// to begin with the genesis group).
    pub fn finish(self) -> Result<Option<Log>, RestoreError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        assert!(self.newest.is_none(), "every group's segment is handed out after it");
        let Some(log) = self.log else {
            return match self.hard == HardState::default() {
                true => Ok(None),
                false => Err(RestoreError::NoGenesis),
            };
        };
        log.finish_restore(self.tail).map(Some)
    }
}

impl Log {
    /// The last step of a restore, from a scan or a stop record: the
    /// commit index checked against the log, the term raised to the log's,
    /// and the groups past the commit index (`tail`: their bytes by LSN,
    /// in order; earlier ones are skipped) made entries.
    pub fn finish_restore(mut self, tail: Vec<(u64, Vec<u8>)>) -> Result<Log, RestoreError> {
        let last = self.last_index();
        if self.hard.commit > last {
            return Err(RestoreError::CommitLost { commit: self.hard.commit, last });
        }
        // A `Ready`'s groups are made durable before its hard state, so a
        // crash between them leaves entries of a term the saved hard state
        // has not reached (a follower's first append in a new term). The
        // host did reach that term, and voted in it for no one whose vote
        // counted: a vote leaves only after the hard state holding it is
        // durable. So the term is raised to the log's, with no vote. Left
        // lower, raft-rs would answer in a term its log had passed (at term
        // 0 it panics answering a pre-vote) and could lead in it.
        let last_term = self.terms.term(last).expect("the log holds its last index");
        if self.hard.term < last_term {
            self.hard.term = last_term;
            self.hard.vote = 0;
        }
        self.held_from = self.hard.commit + 1;
        self.durable = self.hard.commit;
        // Each group's bytes go as its entry is made.
        let mut tail = tail.into_iter().filter(|(lsn, _)| *lsn >= self.held_from);
        for index in self.held_from..=last {
            let (lsn, bytes) = tail.next().expect("the bytes of every group past the commit index");
            assert_eq!(lsn, index, "the bytes of each group past the commit index, in order");
            let entry = self.entry_read_back(index, &bytes);
            self.held.push_back(entry);
        }
        Ok(self)
    }
}

#[cfg(test)]
impl Log {
    /// The log of `segments` (sorted by id, each the whole segment) under
    /// the hard state last saved, scanned whole (`LogBuilder`'s rules);
    /// and the scan, for the caller to rebuild its state from.
    pub fn restore(
        hard: HardState,
        conf: ConfState,
        segments: &[(SegmentId, &[u8])],
    ) -> Result<(Log, Vec<crate::wal::ScannedSegment>), RestoreError> {
        let scanned = crate::wal::scan(segments, false).map_err(RestoreError::Corrupt)?;
        let sizes = segments.iter().map(|(id, b)| (*id, b.len() as u64)).collect();
        let commit = hard.commit;
        let mut builder = LogBuilder::new(hard, conf, sizes);
        for (seg, (_, bytes)) in scanned.iter().zip(segments) {
            for g in &seg.groups {
                let (segment, lsn, epoch, offset, end) = (seg.id, g.lsn, g.epoch, g.offset, g.end);
                builder.group(Admitted { segment, lsn, epoch, offset, end });
                if lsn.0 > commit {
                    builder.bytes(bytes[offset as usize..end as usize].to_vec());
                }
            }
            builder.segment_done(seg.id, seg.header_epoch, seg.sealed);
        }
        let log = builder.finish()?.ok_or(RestoreError::NoGenesis)?;
        Ok((log, scanned))
    }
}
