//! The coordinator's recovery sequence, in order: (take the lease,) sync
//! the WAL, list its segments, read them a window at a time through the
//! streaming scan that rebuilds the committed state, delete junk past the end, commit a fence group, check the offsets
//! store and the sinks' progress, replay open compactions, resume sources.
//! It owns no state: `Startup` remembers where the steps stand, and each
//! step asks the part it concerns.

use super::*;
use crate::io::{OffsetsOp, WalOp};
use crate::recovery::{Recovery, WalDamage};
use crate::wal::{BatchSkipped, Frame, Skipped};
use bytes::Bytes;
use offsets_writer::StoreCheck;
use startup::Read;

impl Host {
    pub(super) fn on_synced(&mut self, result: Result<(), IoError>) {
        match result {
            Ok(()) => {
                self.fx.succeeded(Retry::WalSync);
                if self.authority.raft_ref().is_some_and(|r| !r.hard_state_loaded()) {
                    // Clustered mode reads raft's hard state first.
                    self.fx.io(Pending::HardStateRead, IoOp::Wal(WalOp::ReadHardState));
                } else {
                    self.fx.io(Pending::WalList, IoOp::Wal(WalOp::List));
                }
            }
            Err(_) => self.fx.retry_later(Retry::WalSync),
        }
    }

    pub(super) fn on_listed(&mut self, result: Result<WalListing, IoError>) {
        match result {
            Ok(listing) => {
                self.startup.on_listed(&mut self.fx, listing);
                // A run that stopped on SIGTERM may have left a record that
                // spares the scan.
                self.fx.io(Pending::StopRecordRead, IoOp::Wal(WalOp::ReadStopRecord));
            }
            Err(_) => self.fx.retry_later(Retry::WalList),
        }
    }

    /// The stop record came back: checked against the WAL, or set aside
    /// and the segments scanned. One that cannot be read is set aside too
    /// (it only ever spares work).
    pub(super) fn on_stop_record_read(&mut self, result: Result<Option<Vec<u8>>, IoError>) {
        let bytes = result.unwrap_or_else(|_| {
            self.startup.stop_record_unreadable();
            None
        });
        let trust = self.cfg.mutations.has(Mutation::TrustStaleStopRecord);
        let commit = self.authority.raft_ref().map(|r| r.saved_commit_at_start());
        let read = match self.startup.on_stop_record(&mut self.fx, bytes, &self.names, commit, trust) {
            Some(read) => read,
            None => self.scan(),
        };
        self.on_reading(Ok(read));
    }

    /// Reads the listed segments through the streaming scan.
    fn scan(&mut self) -> Read {
        if self.authority.raft_ref().is_some() {
            return self.scan_cluster();
        }
        let listed = self.startup.take_listed();
        let window = self.cfg.limits.read_window_bytes;
        let lenient = self.cfg.mutations.has(Mutation::AdmitTornSegment);
        let trust = self.cfg.mutations.has(Mutation::IgnoreMissingSegments);
        let mut recovery = Recovery::new(listed, lenient, trust, window)
            .with_record_cache(self.cfg.limits.records(), self.cfg.sinks.len() as u16);
        if self.cfg.mutations.has(Mutation::DropUnfinishedGroup) {
            recovery = recovery.dropping_unfinished_groups();
        }
        self.startup.stream(&mut self.fx, recovery)
    }

    /// Clustered mode: the listed segments read through the streaming scan,
    /// the committed state rebuilt through raft's saved commit index and
    /// raft's log built from every group admitted.
    fn scan_cluster(&mut self) -> Read {
        let listed = self.startup.take_listed();
        let log = self.authority.held_raft().log_builder(self.startup.take_sizes());
        let window = self.cfg.limits.read_window_bytes;
        let recovery = Recovery::new(listed, false, false, window)
            .with_record_cache(self.cfg.limits.records(), self.cfg.sinks.len() as u16)
            .applying_through(log.saved_commit());
        self.startup.stream_cluster(&mut self.fx, recovery, log)
    }

    pub(super) fn on_segment_read(&mut self, segment: SegmentId, result: Result<Bytes, IoError>) {
        match result {
            Ok(bytes) => {
                let read = self.startup.on_read(&mut self.fx, segment, bytes);
                self.on_reading(read)
            }
            Err(_) if self.fx.attempts(Retry::WalRead(segment)) + 1 >= WAL_READ_ATTEMPTS => {
                self.stop(StopReason::WalReadFailed { segment })
            }
            Err(_) => self.fx.retry_later(Retry::WalRead(segment)),
        }
    }

    /// The read of the stop record's check `index` came back. A read that
    /// keeps failing stops the engine like a scan's; an answer that comes
    /// after the record was set aside is dropped.
    pub(super) fn on_check_read(&mut self, index: u32, result: Result<Bytes, IoError>) {
        match result {
            Ok(bytes) => {
                if let Some(read) = self.startup.on_check_read(&mut self.fx, index, bytes) {
                    self.on_reading(Ok(read))
                }
            }
            Err(_) => {
                let Some(segment) = self.startup.check_segment(index) else { return };
                if self.fx.attempts(Retry::WalCheck(index)) + 1 >= WAL_READ_ATTEMPTS {
                    self.stop(StopReason::WalReadFailed { segment })
                } else {
                    self.fx.retry_later(Retry::WalCheck(index))
                }
            }
        }
    }

    /// Where the reading stands after a read was sent or answered.
    fn on_reading(&mut self, read: Result<Read, WalDamage>) {
        match read {
            Ok(Read::More) => {}
            Ok(Read::Done) => self.on_all_read(),
            Ok(Read::Stale) => {
                let read = self.scan();
                self.on_reading(Ok(read))
            }
            Err(damage) => self.on_damage(damage),
        }
    }

    /// Step one, done: every segment is scanned (in clustered mode, raft's
    /// log built along), and the committed state rebuilt.
    fn on_all_read(&mut self) {
        if self.authority.raft_ref().is_some() {
            let limits = self.cfg.limits.records();
            let raft = self.authority.held_raft();
            let (wal, log) = self.startup.take_cluster(limits, |record, tail| raft.recorded_log(record, tail));
            return self.restore_cluster(wal, log);
        }
        let mut wal = match self.startup.take_recovered(self.cfg.limits.records()) {
            Ok(wal) => wal,
            Err(damage) => return self.on_damage(damage),
        };
        if let Some(stop) = names_changed(&wal.state.names, &self.names) {
            return self.stop(stop);
        }
        self.wal.restore(&mut wal, self.fx.now);
        self.committed = wal.state;
        self.records = wal.records;
        self.startup.found(wal.junk, wal.epoch_max.0 >> 32);
        let wal_generation = self.startup.wal_generation();
        if self.authority.lease().is_none_or(|lease| lease.covers(&mut self.fx, wal_generation)) {
            self.after_rebuild();
        }
    }

    /// The segments read so far are damaged, or committed data is missing.
    /// A clustered host reads its WAL before its raft node starts: it has
    /// no leadership to confirm first, and stops at once.
    fn on_damage(&mut self, damage: WalDamage) {
        let stop = match damage {
            WalDamage::Corrupt(c) => StopReason::Corrupt(c),
            WalDamage::Missing(m) => StopReason::WalIncomplete(m),
        };
        match self.authority.raft_ref() {
            Some(_) => self.stop(stop),
            None => self.stop_unless_lease_lost(stop),
        }
    }

    /// The writer's epoch is settled (a lease generation above the WAL's):
    /// delete junk, then fence.
    pub(super) fn after_rebuild(&mut self) {
        // The high half counts writers; the low half comes from this run's
        // seed. Two runs that saw the same WAL (the second started after the
        // first crashed before making anything of its own durable) still get
        // different epochs, so their frames never share a checksum seed.
        let generation = self.authority.writer_generation(self.startup.wal_generation());
        self.wal.set_epoch(Epoch(generation << 32 | (self.cfg.seed & 0xffff_ffff)));
        self.wal.delete_junk(self.startup.take_junk());
        if self.cfg.mutations.has(Mutation::DeleteDuringRecovery) {
            self.wal.delete_oldest_now();
        }
        self.delete_junk();
    }

    /// Segments after the WAL's end whose creation never completed are
    /// deleted before anything new is written: left in place, a later scan
    /// could not tell them from a data segment whose header rotted.
    pub(super) fn delete_junk(&mut self) {
        if !self.wal.deletes_queued() {
            self.startup.set_deleting_junk(false);
            return self.fence();
        }
        self.startup.set_deleting_junk(true);
        self.delete_next();
    }

    /// The new writer's first commit: a fence group under its epoch, at the
    /// key right after the WAL as listed. From here on, a group of an older
    /// writer is not the WAL's; and if another writer committed since the
    /// listing (a stale writer's retry landing late), the fence finds its
    /// bytes in place and this writer stops instead of overwriting them.
    /// Once the fence is in, the listing is known to be the whole WAL.
    fn fence(&mut self) {
        self.startup.set_fencing(true);
        self.wal.push_front(Frame::Fence);
        self.pump();
    }

    /// The fence committed: the listing was the whole WAL.
    pub(super) fn fenced(&mut self) {
        self.startup.set_fencing(false);
        self.fx.io(Pending::OffsetsRead, IoOp::Offsets(OffsetsOp::Read));
    }

    /// Step two, once the fence is in (so no group of an older writer can
    /// land after the listing): the offsets store may lag the WAL, never
    /// lead it.
    pub(super) fn on_offsets_read(&mut self, result: Result<Vec<OffsetRow>, IoError>) {
        let Ok(entries) = result else { return self.fx.retry_later(Retry::OffsetsRead) };
        self.fx.succeeded(Retry::OffsetsRead);
        match self.offsets.check_store(entries, &self.committed) {
            StoreCheck::Consistent => self.ask_sink_progress(),
            StoreCheck::Malformed(stop) => self.stop(stop),
            StoreCheck::Ahead(stop) => self.stop_unless_lease_lost(stop),
        }
    }

    /// Step two, continued: like the offsets store, a sink may lag the WAL,
    /// never lead it. A sink that applied a sequence number the WAL never
    /// planned proves the WAL is older than the sink (a whole data
    /// directory restored from an older backup, offsets store included).
    fn ask_sink_progress(&mut self) {
        if self.startup.ask_progress(&mut self.fx, self.cfg.sinks.len() as u16) {
            self.finish_recovery();
        }
    }

    pub(super) fn on_sink_progress(&mut self, sink: SinkId, applied: Vec<(StreamId, CompactionSeq)>) {
        let last = self.startup.progress_answered(sink);
        for (stream, applied) in applied {
            let wal_next = self.committed.next_seq.get(&(sink, stream)).copied().unwrap_or_default();
            if applied >= wal_next {
                return self.stop_unless_lease_lost(StopReason::SinkAheadOfWal { sink, stream, applied, wal_next });
            }
        }
        if last && self.phase == Phase::Recovering && !self.startup.in_doubt() {
            self.finish_recovery();
        }
    }

    /// Under a lease, what recovery found may only mean that a newer writer
    /// took over meanwhile (it moved the offsets, or deleted a segment this
    /// writer was reading): look at the lease first, and report losing it
    /// if so.
    ///
    /// In clustered mode a shared sink ahead of this host's WAL may mean a
    /// newer leader applied batches this one never heard of: a quorum is
    /// asked to confirm the leadership first (a deposed host stops as
    /// deposed instead).
    fn stop_unless_lease_lost(&mut self, stop: StopReason) {
        if let Some(raft) = self.authority.raft() {
            self.startup.doubt(stop, self.fx.now);
            let news = raft.confirm_leadership(&mut self.fx);
            return self.on_raft_news(news);
        }
        match self.authority.lease() {
            Some(lease) => {
                self.startup.doubt(stop, self.fx.now);
                lease.read(&mut self.fx);
            }
            None => self.stop(stop),
        }
    }

    /// Steps three and four: replay open compactions, resume sources.
    fn finish_recovery(&mut self) {
        assert_eq!(self.phase, Phase::Recovering, "recovery finishes once");
        let sinks = self.cfg.sinks.len() as u16;
        for &key in self.committed.partitions.keys() {
            let floor = (0..sinks).map(|s| self.committed.acked(SinkId(s), key)).min();
            self.records.prune(key, floor.unwrap_or_default());
        }
        self.records.set_limits(self.cfg.limits.records());
        self.sources.restore(&self.committed);
        self.windows.restore(&self.committed);
        // A window the WAL holds open is void: its source starts over
        // past it (section 22).
        let open: Vec<SourceId> = self.committed.windows.keys().copied().collect();
        for source in open {
            let mut end = self.committed.void_window(source).expect("listed as open");
            if self.cfg.mutations.has(Mutation::UnclosedWindowKept) {
                // The planted bug: kept as if its state had closed it.
                let key = |p: &crate::wal::WindowPart| PartitionKey { source, partition: p.partition };
                let held = end.parts.iter().find_map(|p| self.committed.partitions.get(&key(p))?.checkpoint.clone());
                (end.closed, end.checkpoint) = (true, held);
            }
            self.wal.push(Frame::Window(end));
        }
        self.schemas.restore(&self.committed.schemas);
        let replay = !self.cfg.mutations.has(Mutation::SkipCompactionReplay);
        let mut open = self.compaction.restore(&self.cfg, &self.committed, replay);
        if let Err(stop) = self.record_batch_skips(&mut open) {
            return self.stop(stop);
        }
        for (sink, stream) in open {
            self.dispatch(sink, stream);
        }
        self.fx.emit(Output::Recovered(RecoverySummary {
            segments: self.wal.segment_count(),
            leftovers: self.startup.leftovers(),
            next_lsn: self.wal.next_lsn(),
            partitions: self.committed.partitions.len(),
            open_compactions: self.committed.open.len(),
            scanned_bytes: self.startup.read().0,
            scan_time: self.startup.read().1,
            stop_record: self.startup.stop_record(),
        }));
        self.phase = Phase::Running;
        if let Err(stop) = self.record_skips() {
            return self.stop(stop);
        }
        if self.shutdown_requested {
            self.on_shutdown();
        }
        for source in (0..self.cfg.sources.len() as u16).map(SourceId) {
            self.sources.open(&mut self.fx, &self.committed, source);
        }
    }
}

impl Host {
    /// The operator's skips (`run --skip-input`), before any source opens:
    /// each one names input not yet committed (the partition stands at or
    /// before its start) and is recorded in the WAL ahead of everything
    /// read after it; one whose end the partition already passed was done
    /// by an earlier run.
    fn record_skips(&mut self) -> Result<(), StopReason> {
        for skip in self.cfg.skips.clone() {
            let position = self.committed.partitions.get(&skip.key).map_or(Position(0), |p| p.position);
            let (key, at, next) = (skip.key, skip.at, skip.next);
            if position > at && position < next {
                return Err(StopReason::SkipNotNext { key, at, next, position });
            }
            let recorded = position <= at;
            self.fx.emit(Output::Skip { key, at, next, position, recorded });
            if recorded {
                self.wal.push(Frame::Skipped(Skipped {
                    key,
                    stream: skip.stream,
                    at,
                    next,
                    reason: skip.reason.clone(),
                }));
                self.sources.skip(&skip);
            }
        }
        Ok(())
    }
}

impl Host {
    /// The operator's batch skips (`run --skip-batch`), before the open
    /// plans are sent again: each names a plan that is open and not
    /// settled (its sink holds none of its attempts, as far as the WAL
    /// knows), which is given up (its slot idle, the frame with the next
    /// group), or one done by an earlier run (nothing to do). One not yet
    /// planned, or settled with dead letters to deliver, stops the engine
    /// with nothing given up.
    fn record_batch_skips(&mut self, open: &mut Vec<(SinkId, StreamId)>) -> Result<(), StopReason> {
        for skip in self.cfg.batch_skips.clone() {
            let (sink, stream, seq) = (skip.sink, skip.stream, skip.seq);
            let slot = (sink, stream);
            let next = self.committed.next_seq.get(&slot).copied().unwrap_or_default();
            let plan = self.committed.open.get(&slot).filter(|p| p.seq == seq);
            // The sink holds an attempt of this very plan.
            let settled = plan.is_some() && self.committed.settled.contains_key(&slot);
            let Some(plan) = plan.filter(|_| !settled) else {
                let done = seq < next && self.committed.open.get(&slot).is_none_or(|p| p.seq != seq);
                if !done {
                    return Err(StopReason::BatchSkipNotOpen { sink, stream, seq, next, settled });
                }
                self.fx.emit(Output::BatchSkip { sink, stream, seq, recorded: false });
                continue;
            };
            let id = plan.id;
            self.fx.emit(Output::BatchSkip { sink, stream, seq, recorded: true });
            self.wal.push(Frame::BatchSkipped(BatchSkipped { sink, stream, seq, id, reason: skip.reason }));
            let too_far = self.cfg.mutations.has(Mutation::BatchSkipTooFar);
            self.compaction.give_up(sink, stream, &self.committed, too_far);
            open.retain(|&o| o != slot);
        }
        Ok(())
    }
}

/// Every name the WAL used must mean the same thing under this
/// configuration: the same name at the same index. New names may follow.
pub(super) fn names_changed(wal: &Names, config: &Names) -> Option<StopReason> {
    let lists = [
        ("source", &wal.sources, &config.sources),
        ("sink", &wal.sinks, &config.sinks),
        ("stream", &wal.streams, &config.streams),
    ];
    for (kind, wal, config) in lists {
        for (index, name) in wal.iter().enumerate() {
            if config.get(index) != Some(name) {
                let config = config.get(index).cloned().unwrap_or_else(|| "(none)".into());
                return Some(StopReason::NamesChanged { kind, index, wal: name.clone(), config });
            }
        }
    }
    None
}
