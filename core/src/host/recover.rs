//! Recovery, in order: (take the lease,) sync the WAL, list and read its
//! segments, scan and rebuild the committed state, delete junk past the end,
//! commit a fence group, check the offsets store, replay open compactions,
//! resume sources.

use super::*;

impl Host {
    pub(super) fn on_listed(&mut self, mut ids: Vec<SegmentId>) {
        self.succeeded(Retry::WalList);
        ids.sort_unstable();
        ids.dedup();
        self.recovery.listed = ids.clone();
        if ids.is_empty() {
            return self.on_all_read();
        }
        for segment in ids {
            self.io(Pending::WalRead(segment), IoOp::WalRead { segment });
        }
    }

    pub(super) fn on_segment_read(&mut self, segment: SegmentId, bytes: Vec<u8>) {
        self.succeeded(Retry::WalRead(segment));
        self.recovery.read.insert(segment, bytes);
        if self.recovery.read.len() == self.recovery.listed.len() {
            self.on_all_read();
        }
    }

    /// Step one: scan the committed segments and rebuild state from them.
    pub(super) fn on_all_read(&mut self) {
        let read = std::mem::take(&mut self.recovery.read);
        let segments: Vec<(SegmentId, &[u8])> = read.iter().map(|(id, b)| (*id, b.as_slice())).collect();
        let lenient = self.cfg.mutations.has(Mutation::AdmitTornSegment);
        let trust = self.cfg.mutations.has(Mutation::IgnoreMissingSegments);
        let wal = match recover(&segments, lenient, trust) {
            Ok(wal) => wal,
            Err(WalDamage::Corrupt(c)) => return self.stop_unless_lease_lost(StopReason::Corrupt(c)),
            Err(WalDamage::Missing(m)) => return self.stop_unless_lease_lost(StopReason::WalIncomplete(m)),
        };
        if let Some(stop) = names_changed(&wal.state.names, &self.names) {
            return self.stop(stop);
        }
        self.committed = wal.state;
        self.records = wal.records;
        self.wal.segments = wal.segments;
        self.wal.spares = wal.spares;
        self.wal.next_lsn = wal.next_lsn;
        self.wal.next_segment = wal.next_segment;
        self.wal.active = wal.active.map(|(id, offset)| Active { id, offset, opened: self.now, seal_requested: false });
        self.recovery.junk = wal.junk;
        self.recovery.wal_generation = wal.epoch_max.0 >> 32;
        if self.lease_covers(self.recovery.wal_generation) {
            self.after_rebuild();
        }
    }

    /// The writer's epoch is settled (a lease generation above the WAL's):
    /// delete junk, then fence.
    pub(super) fn after_rebuild(&mut self) {
        // The high half counts writers; the low half comes from this run's
        // seed. Two runs that saw the same WAL (the second started after the
        // first crashed before making anything of its own durable) still get
        // different epochs, so their frames never share a checksum seed.
        let generation = self.writer_generation(self.recovery.wal_generation);
        self.wal.epoch = Epoch(generation << 32 | (self.cfg.seed & 0xffff_ffff));
        self.wal.deletes.extend(std::mem::take(&mut self.recovery.junk));
        if self.cfg.mutations.has(Mutation::DeleteDuringRecovery) {
            if let Some(seg) = self.wal.segments.front().filter(|s| s.sealed) {
                self.wal.deletes.push_front(seg.id);
                self.wal.segments.pop_front();
            }
        }
        self.delete_junk();
    }

    /// Step two, once the fence is in (so no group of an older writer can
    /// land after the listing): the offsets store may lag the WAL, never
    /// lead it.
    pub(super) fn on_offsets_read(&mut self, entries: Vec<OffsetRow>) {
        self.succeeded(Retry::OffsetsRead);
        let mut stored = BTreeMap::new();
        for (key, bytes, _checkpoint) in entries {
            let Ok(value) = OffsetValue::decode(&bytes) else {
                return self.stop(StopReason::OffsetsMalformed { key, len: bytes.len() });
            };
            stored.insert(key, value);
        }
        for (key, value) in &stored {
            let wal = self.committed.partitions.get(key).map(|p| p.position).unwrap_or_default();
            if value.position > wal {
                let stop = StopReason::OffsetsAheadOfWal { key: *key, store: value.position, wal };
                return self.stop_unless_lease_lost(stop);
            }
        }
        for (key, p) in &self.committed.partitions {
            if stored.get(key).is_none_or(|v| v.lsn < p.lsn || v.position != p.position) {
                self.offsets_dirty.insert(*key);
            }
        }
        self.ask_sink_progress();
    }

    /// Step two, continued: like the offsets store, a sink may lag the WAL,
    /// never lead it. A sink that applied a sequence number the WAL never
    /// planned proves the WAL is older than the sink (a whole data
    /// directory restored from an older backup, offsets store included).
    fn ask_sink_progress(&mut self) {
        let sinks: Vec<SinkId> = (0..self.cfg.sinks.len() as u16).map(SinkId).collect();
        self.recovery.progress_pending = sinks.iter().copied().collect();
        for sink in sinks {
            self.io(Pending::SinkProgress(sink), IoOp::SinkProgress { sink });
        }
        if self.recovery.progress_pending.is_empty() {
            self.finish_recovery();
        }
    }

    pub(super) fn on_sink_progress(&mut self, sink: SinkId, applied: Vec<(StreamId, CompactionSeq)>) {
        assert!(self.recovery.progress_pending.remove(&sink), "one progress answer per sink");
        for (stream, applied) in applied {
            let wal_next = self.committed.next_seq.get(&(sink, stream)).copied().unwrap_or_default();
            if applied >= wal_next {
                return self.stop_unless_lease_lost(StopReason::SinkAheadOfWal { sink, stream, applied, wal_next });
            }
        }
        let doubted = self.recovery.doubt.is_some();
        if self.recovery.progress_pending.is_empty() && self.phase == Phase::Recovering && !doubted {
            self.finish_recovery();
        }
    }

    /// Segments after the WAL's end whose creation never completed are
    /// deleted before anything new is written: left in place, a later scan
    /// could not tell them from a data segment whose header rotted.
    pub(super) fn delete_junk(&mut self) {
        if self.wal.deletes.is_empty() {
            self.recovery.deleting_junk = false;
            return self.fence();
        }
        self.recovery.deleting_junk = true;
        self.delete_next();
    }

    /// Under a lease, what recovery found may only mean that a newer writer
    /// took over meanwhile (it moved the offsets, or deleted a segment this
    /// writer was reading): look at the lease first, and report losing it
    /// if so.
    fn stop_unless_lease_lost(&mut self, stop: StopReason) {
        if self.cfg.lease.is_some() {
            self.recovery.doubt = Some((stop, self.now));
            return self.lease_read();
        }
        self.stop(stop);
    }

    /// The new writer's first commit: a fence group under its epoch, at the
    /// key right after the WAL as listed. From here on, a group of an older
    /// writer is not the WAL's; and if another writer committed since the
    /// listing (a stale writer's retry landing late), the fence finds its
    /// bytes in place and this writer stops instead of overwriting them.
    /// Once the fence is in, the listing is known to be the whole WAL.
    fn fence(&mut self) {
        self.recovery.fencing = true;
        self.pending_bytes += Frame::Fence.encoded_len() as u64;
        self.pending.push_front(Frame::Fence);
        self.pump();
    }

    /// Steps three and four: replay open compactions, resume sources.
    pub(super) fn finish_recovery(&mut self) {
        assert_eq!(self.phase, Phase::Recovering, "recovery finishes once");
        let sinks = self.cfg.sinks.len() as u16;
        let keys: Vec<PartitionKey> = self.committed.partitions.keys().copied().collect();
        for &key in &keys {
            self.accepted.insert(key, self.committed.partitions[&key].position);
            let mut floor = None::<Position>;
            for sink in (0..sinks).map(SinkId) {
                let through = self.committed.planned_through(sink, key);
                self.planned.insert((sink, key), through);
                let acked = self.committed.acked(sink, key);
                floor = Some(floor.map_or(acked, |f| f.min(acked)));
            }
            self.records.prune(key, floor.unwrap_or_default());
        }
        self.next_seq = self.committed.next_seq.clone();
        self.schema_live = self.committed.schemas.clone();
        for sink in (0..sinks).map(SinkId) {
            for stream in (0..self.cfg.streams.len() as u16).map(StreamId) {
                self.slots.insert((sink, stream), Slot::Idle);
            }
        }
        let replay = !self.cfg.mutations.has(Mutation::SkipCompactionReplay);
        let open: Vec<CompactionPlan> = self.committed.open.values().cloned().collect();
        let open_count = open.len();
        for plan in open {
            let key = (plan.sink, plan.stream);
            if replay {
                let slot = Slot::Planned { plan, committed: true, io: None, dispatched: false };
                self.slots.insert(key, slot);
                self.dispatch(key.0, key.1);
            }
        }
        self.out.push_back(Output::Recovered(RecoverySummary {
            segments: self.wal.segments.len(),
            next_lsn: self.wal.next_lsn,
            partitions: self.committed.partitions.len(),
            open_compactions: open_count,
        }));
        self.phase = Phase::Running;
        if self.shutdown_requested {
            self.on_shutdown();
        }
        for source in (0..self.cfg.sources.len() as u16).map(SourceId) {
            self.open_source(source);
        }
    }

    pub(super) fn open_source(&mut self, source: SourceId) {
        let resume = self
            .committed
            .partitions
            .iter()
            .filter(|(key, _)| key.source == source)
            .map(|(key, p)| ResumePoint {
                partition: key.partition,
                position: p.position,
                checkpoint: p.checkpoint.clone(),
            })
            .collect();
        self.io(Pending::SourceOpen(source), IoOp::SourceOpen { source, resume });
    }
}

/// Every name the WAL used must mean the same thing under this
/// configuration: the same name at the same index. New names may follow.
fn names_changed(wal: &Names, config: &Names) -> Option<StopReason> {
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
