//! Recovery's own progress: which segments were listed, the read under way
//! (a window at a time, through recovery's streaming scan), the
//! leftovers of interrupted deletions below the WAL (object stores), the junk
//! found past the WAL's end, the highest writer generation seen, whether the
//! junk deletion or the fence is under way, a stop held in doubt until the
//! lease is read again, and the sinks whose progress answer is awaited. The
//! steps themselves are sequenced by the coordinator (`recover.rs`); this
//! part only remembers where they stand. Talks only to [`Effects`].

use super::effects::{Effects, Pending, Retry};
use crate::consensus::log::{Log, LogBuilder, LogRecord, RestoreError};
use crate::ids::*;
use crate::io::{IoOp, StopReason, StopRecordUse, WalListing};
use crate::io::{PluginOp, WalOp};
use crate::records::RecordLimits;
use crate::recovery::stop_record::{Check, StopRecord};
use crate::recovery::{RecoveredWal, Recovery, WalDamage};
use crate::time::{Duration, Instant};
use crate::wal::stream::ReadAt;
use crate::wal::{split_leftovers, Names};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Default)]
pub(super) struct Startup {
    /// The segments listed (leftovers set aside), until the reading starts.
    listed: Vec<SegmentId>,
    /// Each segment file's length, where the listing gives it (disk).
    sizes: BTreeMap<SegmentId, u64>,
    /// What became of the last run's stop record.
    stop_record: StopRecordUse,
    /// Listed below the oldest segment that still counts: deleted with the
    /// junk, under the same authority check, before the fence.
    leftovers: Vec<SegmentId>,
    reading: Reading,
    /// When the listing came back, and the bytes read since; and how long
    /// the reading took.
    listed_at: Instant,
    read_bytes: u64,
    read_time: Duration,
    junk: Vec<SegmentId>,
    /// The highest writer generation in the WAL.
    wal_generation: u64,
    /// Junk after the WAL's end is being deleted; the fence follows.
    deleting_junk: bool,
    /// The fence group is pending or in flight: recovery finishes once it
    /// commits.
    fencing: bool,
    /// A stop recovery found, held until the lease is read again: if
    /// another writer took over, losing the lease is the real story.
    doubt: Option<(StopReason, Instant)>,
    /// Sinks asked for their progress and not answered yet.
    progress_pending: BTreeSet<SinkId>,
}

/// How the listed segments are read: a scan's windows one at a time, a
/// stop record's checks several at once.
#[derive(Default)]
enum Reading {
    #[default]
    Idle,
    /// Through recovery's streaming scan, which asks for each window and
    /// keeps only what it rebuilt.
    Stream(Box<Recovery>),
    /// The last run's stop record, checked against the WAL, the checks'
    /// reads sent in order, several at once; in clustered mode, the bytes
    /// of raft's groups past the commit index kept as they are read (by
    /// LSN).
    Check { record: Box<StopRecord>, checks: Checks, tail: Vec<(u64, Vec<u8>)>, trust: bool },
    /// Clustered mode: the streaming scan rebuilds the committed state
    /// through raft's commit index, and everything it admits builds raft's
    /// log.
    Cluster { recovery: Box<Recovery>, log: Box<LogBuilder> },
}

/// A stop record's checks and their reads: sent in order, several at
/// once but one per segment at a time (an object store's driver lists a
/// segment at its first read and reads on from that listing), at most
/// `CHECK_BYTES_IN_FLIGHT` bytes asked for at once (one read at least),
/// each answered once.
#[derive(Default)]
pub(super) struct Checks {
    all: Vec<Check>,
    sent: Vec<bool>,
    /// Every check before this one was sent.
    unsent: usize,
    answered: usize,
    /// Segments with a check's read in flight.
    busy: BTreeSet<SegmentId>,
    /// Bytes asked for and not answered.
    in_flight: u64,
}

/// How many bytes of a stop record's check reads may be asked for at once:
/// on an object store each read is a request, whose latency the checks
/// would otherwise pay one after the other.
const CHECK_BYTES_IN_FLIGHT: u64 = 16 << 20;

impl Checks {
    fn new(all: Vec<Check>) -> Checks {
        Checks { sent: vec![false; all.len()], all, ..Checks::default() }
    }

    /// Sends the next checks' reads, in order, within the bounds: a check
    /// whose segment is busy waits (and the later ones of that segment with
    /// it); one past the bytes bound stops the sending.
    fn send(&mut self, fx: &mut Effects) {
        for i in self.unsent..self.all.len() {
            let ReadAt { segment, len, .. } = self.all[i].read();
            if self.sent[i] || self.busy.contains(&segment) {
                continue;
            }
            if self.in_flight > 0 && self.in_flight + len as u64 > CHECK_BYTES_IN_FLIGHT {
                break;
            }
            (self.sent[i], self.in_flight) = (true, self.in_flight + len as u64);
            self.busy.insert(segment);
            self.ask(fx, i as u32);
        }
        while self.sent.get(self.unsent).is_some_and(|s| *s) {
            self.unsent += 1;
        }
    }

    /// Sends the read of check `index`.
    fn ask(&self, fx: &mut Effects, index: u32) {
        let ReadAt { segment, offset, len } = self.all[index as usize].read();
        fx.io(Pending::WalCheck(index), IoOp::Wal(WalOp::ReadAt { segment, offset, len }));
    }

    fn done(&self) -> bool {
        self.answered == self.all.len()
    }
}

/// What a read that came back leaves to do.
pub(super) enum Read {
    /// The next window is asked for.
    More,
    /// Every listed segment is read (or the stop record checked).
    Done,
    /// The stop record does not match the WAL: the segments are to be
    /// scanned.
    Stale,
}

/// Where a stop held in doubt stands after a lease read that shows the
/// row is still ours.
pub(super) enum Doubt {
    None,
    /// The read was sent after the doubt arose: the stop stands.
    Confirmed(StopReason),
    /// The read is older than the doubt: read again.
    Early,
}

impl Startup {
    /// The listing came back: the segments of the WAL, sorted, with the
    /// leftovers of an object store's interrupted deletions set aside.
    pub(super) fn on_listed(&mut self, fx: &mut Effects, listing: WalListing) -> Vec<SegmentId> {
        fx.succeeded(Retry::WalList);
        self.listed_at = fx.now;
        let mut ids = match listing {
            WalListing::Files(sized) => {
                self.sizes = sized.iter().copied().collect();
                sized.into_iter().map(|(id, _)| id).collect()
            }
            WalListing::Objects(objects) => {
                let (leftovers, kept) = split_leftovers(&objects);
                self.leftovers = leftovers;
                kept
            }
        };
        ids.sort_unstable();
        ids.dedup();
        self.listed.clone_from(&ids);
        ids
    }

    /// The segments listed, to scan.
    pub(super) fn take_listed(&mut self) -> Vec<SegmentId> {
        std::mem::take(&mut self.listed)
    }

    /// The last run's stop record came back (`None`: there is none, or it
    /// could not be read). One that decodes and names exactly the segments
    /// listed, written under the same configured names (which batches are
    /// held depends on the sinks), is checked against them, its reads sent;
    /// otherwise the segments are to be scanned (`None`). In clustered mode
    /// (`commit`: raft's saved commit index) the record must be a clustered
    /// host's, written at that same commit index; and a single writer's
    /// must not be one. `trust` is the planted bug `trust-stale-stop-record`:
    /// no check at all (a clustered host still reads the groups past the
    /// commit index, which raft's log holds as entries).
    pub(super) fn on_stop_record(
        &mut self,
        fx: &mut Effects,
        bytes: Option<Vec<u8>>,
        config: &Names,
        commit: Option<u64>,
        trust: bool,
    ) -> Option<Read> {
        let record = match StopRecord::decode(&bytes?) {
            Ok(record) => record,
            Err(why) => {
                self.stop_record = StopRecordUse::Stale(why);
                return None;
            }
        };
        let stale = if trust {
            None
        } else if record.config != *config {
            Some("the configured sources, sinks or streams are not those of the run that wrote the stop record")
        } else if record.listing() != self.listed {
            Some("the WAL's segments are not the ones the stop record names")
        } else if record.raft.is_some() != commit.is_some() {
            Some("the stop record was written in another storage mode")
        } else if commit.is_some_and(|c| !record.matches_commit(c)) {
            Some("raft's saved commit index is not the one the stop record was written at")
        } else {
            None
        };
        if let Some(why) = stale {
            self.stop_record = StopRecordUse::Stale(why);
            return None;
        }
        let mut checks = record.checks();
        if trust {
            let commit = record.raft.as_ref().map_or(u64::MAX, |r| r.commit);
            checks.retain(|c| matches!(c, Check::Entry { place, .. } if place.lsn.0 > commit));
        }
        self.stop_record = StopRecordUse::Used;
        let checks = Checks::new(checks);
        self.reading = Reading::Check { record: Box::new(record), checks, tail: Vec::new(), trust };
        Some(self.send_read(fx))
    }

    pub(super) fn stop_record_unreadable(&mut self) {
        self.stop_record = StopRecordUse::Stale("the stop record could not be read");
    }

    pub(super) fn stop_record(&self) -> StopRecordUse {
        self.stop_record
    }

    /// Reads the listed segments through `recovery`'s scan.
    pub(super) fn stream(&mut self, fx: &mut Effects, recovery: Recovery) -> Read {
        self.reading = Reading::Stream(Box::new(recovery));
        self.send_read(fx)
    }

    /// Clustered mode: reads the listed segments through `recovery`'s
    /// scan, each group it admits handed to `log` too.
    pub(super) fn stream_cluster(&mut self, fx: &mut Effects, recovery: Recovery, log: LogBuilder) -> Read {
        self.reading = Reading::Cluster { recovery: Box::new(recovery), log: Box::new(log) };
        self.send_read(fx)
    }

    /// Each listed segment file's length.
    pub(super) fn take_sizes(&mut self) -> BTreeMap<SegmentId, u64> {
        std::mem::take(&mut self.sizes)
    }

    fn next_read(&self) -> Option<ReadAt> {
        match &self.reading {
            Reading::Idle => None,
            Reading::Stream(recovery) | Reading::Cluster { recovery, .. } => recovery.next_read(),
            Reading::Check { .. } => None,
        }
    }

    /// Asks for the next window (again, after a failed read), if any; or
    /// for the stop record's checks, as many as may be in flight.
    pub(super) fn send_read(&mut self, fx: &mut Effects) -> Read {
        if let Reading::Check { checks, .. } = &mut self.reading {
            checks.send(fx);
            return if checks.done() { Read::Done } else { Read::More };
        }
        let Some(ReadAt { segment, offset, len }) = self.next_read() else { return Read::Done };
        fx.io(Pending::WalRead(segment), IoOp::Wal(WalOp::ReadAt { segment, offset, len }));
        Read::More
    }

    /// A window came back: fed to the scan (whose damage ends the reading),
    /// or laid after the bytes read before it.
    pub(super) fn on_read(&mut self, fx: &mut Effects, segment: SegmentId, bytes: Bytes) -> Result<Read, WalDamage> {
        fx.succeeded(Retry::WalRead(segment));
        self.read_bytes += bytes.len() as u64;
        self.read_time = fx.now.saturating_since(self.listed_at);
        match &mut self.reading {
            Reading::Idle => unreachable!("a read is answered only while reading"),
            Reading::Stream(recovery) => recovery.feed(bytes).inspect_err(|_| self.reading = Reading::Idle)?,
            Reading::Check { .. } => unreachable!("a check's read is answered as one"),
            Reading::Cluster { recovery, log } => {
                recovery.feed_seeing(bytes, |item| log.see(item)).inspect_err(|_| self.reading = Reading::Idle)?
            }
        }
        Ok(self.send_read(fx))
    }

    /// The read of check `index` came back; `None` if the reading has
    /// moved on (a mismatch set the record aside while it was in flight).
    pub(super) fn on_check_read(&mut self, fx: &mut Effects, index: u32, bytes: Bytes) -> Option<Read> {
        let Reading::Check { record, checks, tail, trust } = &mut self.reading else { return None };
        fx.succeeded(Retry::WalCheck(index));
        self.read_bytes += bytes.len() as u64;
        self.read_time = fx.now.saturating_since(self.listed_at);
        let check = checks.all[index as usize];
        let ReadAt { segment, len, .. } = check.read();
        checks.in_flight -= len as u64;
        checks.answered += 1;
        checks.busy.remove(&segment);
        if let Some(why) = check.mismatch(&bytes).filter(|_| !*trust) {
            self.stop_record = StopRecordUse::Stale(why);
            self.reading = Reading::Idle;
            return Some(Read::Stale);
        }
        if let (Check::Entry { place, .. }, Some(raft)) = (check, &record.raft) {
            if place.lsn.0 > raft.commit {
                tail.push((place.lsn.0, bytes.to_vec()));
            }
        }
        Some(self.send_read(fx))
    }

    /// Sends the read of check `index` again (after it failed); its
    /// segment, to name if it keeps failing.
    pub(super) fn resend_check(&mut self, fx: &mut Effects, index: u32) {
        if let Reading::Check { checks, .. } = &self.reading {
            checks.ask(fx, index);
        }
    }

    /// The segment check `index` reads, while the record is being checked.
    pub(super) fn check_segment(&self, index: u32) -> Option<SegmentId> {
        match &self.reading {
            Reading::Check { checks, .. } => Some(checks.all[index as usize].read().segment),
            _ => None,
        }
    }

    /// What the streaming scan rebuilt, once every segment is read; or
    /// what the stop record holds, once checked (its batches held only in
    /// the WAL, under `limits`).
    pub(super) fn take_recovered(&mut self, limits: RecordLimits) -> Result<RecoveredWal, WalDamage> {
        match std::mem::take(&mut self.reading) {
            Reading::Stream(recovery) => recovery.finish(),
            Reading::Check { record, .. } => Ok(record.into_recovered(limits)),
            _ => unreachable!("taken once, after a streamed read"),
        }
    }

    /// Clustered mode, once every segment is read: the committed state
    /// rebuilt through raft's commit index, and raft's log. Or, from a
    /// stop record checked: the state it holds and the log `recorded`
    /// makes of its record and the bytes of the groups past the commit
    /// index.
    pub(super) fn take_cluster(
        &mut self,
        limits: RecordLimits,
        recorded: impl FnOnce(LogRecord, Vec<(u64, Vec<u8>)>) -> Result<Log, RestoreError>,
    ) -> (Result<RecoveredWal, WalDamage>, Result<Option<Log>, RestoreError>) {
        match std::mem::take(&mut self.reading) {
            Reading::Cluster { recovery, log } => (recovery.finish(), log.finish()),
            Reading::Check { mut record, mut tail, .. } => {
                tail.sort_unstable_by_key(|(lsn, _)| *lsn);
                let raft = record.raft.take().expect("a clustered host uses a clustered record");
                (Ok(record.into_recovered(limits)), recorded(raft.log, tail).map(Some))
            }
            _ => unreachable!("taken once, after a clustered read"),
        }
    }

    pub(super) fn found(&mut self, junk: Vec<SegmentId>, wal_generation: u64) {
        self.junk = junk;
        self.wal_generation = wal_generation;
    }

    pub(super) fn wal_generation(&self) -> u64 {
        self.wal_generation
    }

    /// Everything to delete before the fence, oldest first: the leftovers
    /// below the WAL, then the junk past its end.
    pub(super) fn take_junk(&mut self) -> Vec<SegmentId> {
        let mut all = self.leftovers.clone();
        all.append(&mut self.junk);
        all
    }

    /// Bytes of the WAL read, and the time from the listing to the last.
    pub(super) fn read(&self) -> (u64, Duration) {
        (self.read_bytes, self.read_time)
    }

    pub(super) fn leftovers(&self) -> usize {
        self.leftovers.len()
    }

    pub(super) fn set_deleting_junk(&mut self, deleting: bool) {
        self.deleting_junk = deleting;
    }

    pub(super) fn deleting_junk(&self) -> bool {
        self.deleting_junk
    }

    pub(super) fn set_fencing(&mut self, fencing: bool) {
        self.fencing = fencing;
    }

    pub(super) fn fencing(&self) -> bool {
        self.fencing
    }

    pub(super) fn doubt(&mut self, stop: StopReason, now: Instant) {
        self.doubt = Some((stop, now));
    }

    pub(super) fn in_doubt(&self) -> bool {
        self.doubt.is_some()
    }

    /// A lease read sent at `sent_at` shows the row is ours.
    pub(super) fn resolve_doubt(&mut self, sent_at: Instant) -> Doubt {
        match self.doubt.take() {
            None => Doubt::None,
            Some((stop, since)) if sent_at >= since => Doubt::Confirmed(stop),
            Some(doubt) => {
                self.doubt = Some(doubt);
                Doubt::Early
            }
        }
    }

    /// Asks every sink for its progress; true when there are none to ask.
    pub(super) fn ask_progress(&mut self, fx: &mut Effects, sinks: u16) -> bool {
        self.progress_pending = (0..sinks).map(SinkId).collect();
        for sink in (0..sinks).map(SinkId) {
            fx.io(Pending::SinkProgress(sink), IoOp::Plugin(PluginOp::SinkProgress { sink }));
        }
        self.progress_pending.is_empty()
    }

    /// True when that was the last answer awaited.
    pub(super) fn progress_answered(&mut self, sink: SinkId) -> bool {
        assert!(self.progress_pending.remove(&sink), "one progress answer per sink");
        self.progress_pending.is_empty()
    }
}
