//! Sources in, acks and offsets out: reads under backpressure, dropping
//! re-sent records, splitting batches into frames, acking sources and
//! materializing offsets from committed positions only.

use super::*;

impl Host {
    pub(super) fn backpressured(&self) -> bool {
        let l = &self.cfg.limits;
        self.pending_bytes >= l.pending_bytes_max || self.records.bytes() >= l.uncompacted_bytes_max
    }

    pub(super) fn read_sources(&mut self) {
        if self.phase != Phase::Running {
            return;
        }
        for i in 0..self.sources.len() {
            if self.backpressured() {
                return;
            }
            let s = &self.sources[i];
            let source = SourceId(i as u16);
            let held = self.schema_waits.values().any(|w| w.batches.iter().any(|(s, _)| *s == source));
            if s.opened && s.read.is_none() && !s.waiting && !s.exhausted && !held {
                let records_max = self.cfg.limits.source_read_records_max;
                let id = self.io(Pending::SourceRead(source), IoOp::SourceRead { source, records_max });
                self.sources[i].read = Some(id);
            }
        }
    }

    pub(super) fn on_source_read(&mut self, source: SourceId, result: Result<IoReply, IoError>) {
        let i = source.0 as usize;
        self.sources[i].read = None;
        match result {
            Ok(IoReply::Batches { batches, exhausted }) => {
                self.succeeded(Retry::SourceRead(source));
                self.sources[i].exhausted = exhausted;
                if self.cfg.stop_when_exhausted && self.sources.iter().all(|s| s.exhausted) {
                    self.on_shutdown();
                }
                let mut any = false;
                for batch in batches {
                    any |= !batch.records.is_empty();
                    if let Err(what) = self.accept(source, batch) {
                        return self.stop(what);
                    }
                }
                if !any && !exhausted {
                    self.sources[i].waiting = true;
                    self.schedule(self.now + self.cfg.limits.source_poll, Retry::SourceRead(source));
                }
            }
            Ok(other) => panic!("SourceRead answered with {other:?}"),
            Err(_) => {
                self.sources[i].waiting = true;
                self.retry_later(Retry::SourceRead(source));
            }
        }
    }

    /// Takes a source batch into the pending group, dropping records at or
    /// below what the partition already holds.
    /// Takes a source batch in, once its stream's schema is decided: a batch
    /// under a schema the WAL has no decision for waits (with every later
    /// batch of its stream) while the schema plugin is asked.
    pub(super) fn accept(&mut self, source: SourceId, batch: SourceBatchIn) -> Result<(), StopReason> {
        if batch.stream.0 as usize >= self.cfg.streams.len() {
            let what = "unknown stream";
            return Err(StopReason::SourceProtocol { source, partition: batch.partition, what });
        }
        let stream = batch.stream;
        if let Some(wait) = self.schema_waits.get_mut(&stream) {
            wait.batches.push_back((source, batch));
            return Ok(());
        }
        if let Some(schema) = batch.schema.clone() {
            let fingerprint = xxhash_rust::xxh3::xxh3_64(&schema);
            if self.schema_live.get(&stream) != Some(&fingerprint) {
                if !self.cfg.schema_plugin {
                    self.decide_schema(stream, fingerprint);
                } else {
                    let batches = VecDeque::from([(source, batch)]);
                    self.schema_waits.insert(stream, SchemaWait { fingerprint, schema, batches });
                    self.ask_schema(stream);
                    return Ok(());
                }
            }
        }
        self.accept_decided(source, batch)
    }

    pub(super) fn ask_schema(&mut self, stream: StreamId) {
        let Some(wait) = self.schema_waits.get(&stream) else { return };
        let op = IoOp::SchemaDecide { stream, fingerprint: wait.fingerprint, schema: Arc::clone(&wait.schema) };
        self.io(Pending::SchemaDecide(stream), op);
    }

    /// The schema plugin answered: commit the decision, then let the waiting
    /// batches in, in order (a later one may carry yet another schema).
    pub(super) fn on_schema_decided(&mut self, stream: StreamId, result: Result<IoReply, IoError>) {
        let (accept, reason) = match result {
            Ok(IoReply::Schema { accept, reason }) => (accept, reason),
            Ok(other) => panic!("SchemaDecide answered with {other:?}"),
            Err(_) => return self.retry_later(Retry::SchemaDecide(stream)),
        };
        self.succeeded(Retry::SchemaDecide(stream));
        let wait = self.schema_waits.remove(&stream).expect("a decision answers a wait");
        if !accept {
            let fingerprint = wait.fingerprint;
            return self.stop(StopReason::SchemaRejected { stream, fingerprint, reason });
        }
        self.decide_schema(stream, wait.fingerprint);
        for (source, batch) in wait.batches {
            if let Err(stop) = self.accept(source, batch) {
                return self.stop(stop);
            }
        }
    }

    /// A decision is a frame: committed before the batches it admits, and
    /// never asked again once committed.
    fn decide_schema(&mut self, stream: StreamId, fingerprint: u64) {
        self.schema_live.insert(stream, fingerprint);
        self.push_frame(Frame::SchemaDecision(SchemaDecision { stream, fingerprint }));
    }

    fn accept_decided(&mut self, source: SourceId, batch: SourceBatchIn) -> Result<(), StopReason> {
        let key = PartitionKey { source, partition: batch.partition };
        let protocol = |what| StopReason::SourceProtocol { source, partition: batch.partition, what };
        if !batch.records.windows(2).all(|w| w[0].position < w[1].position)
            || batch.records.last().is_some_and(|r| r.position >= batch.end)
        {
            return Err(protocol("record positions must increase and stay below the batch end"));
        }
        if let Some(p) = self.committed.partitions.get(&key) {
            if p.stream != batch.stream {
                return Err(protocol("a partition cannot change stream"));
            }
        }
        let floor = self.accepted.get(&key).copied().unwrap_or_default();
        let mut records = batch.records;
        if !self.cfg.mutations.has(Mutation::AcceptResentRecords) {
            records.retain(|r| r.position >= floor);
        }
        if records.is_empty() {
            return Ok(());
        }
        let end = batch.end;
        if !self.cfg.mutations.has(Mutation::AcceptResentRecords) {
            assert!(end > floor, "a batch with new records ends past the floor");
        }
        self.accepted.insert(key, end);
        // Every chunk leaves room for the checkpoint the last one carries.
        let checkpoint_bytes = batch.checkpoint.as_ref().map_or(0, |c| 4 + c.len());
        let group_room = (self.cfg.limits.group_bytes_max - SEAL_RESERVE) as usize - FRAME_HEADER_BYTES - 64;
        let Some(frame_budget) = group_room.checked_sub(checkpoint_bytes).filter(|b| *b >= 64) else {
            return Err(protocol("a checkpoint is larger than a commit group allows"));
        };
        let mut chunk: Vec<Record> = Vec::new();
        let mut chunk_bytes = 0usize;
        let total = records.len();
        for (n, record) in records.into_iter().enumerate() {
            let len = 12 + record.bytes.len();
            if len > frame_budget {
                return Err(protocol("a record is larger than a commit group allows"));
            }
            if chunk_bytes + len > frame_budget {
                let next = record.position;
                self.push_batch(key, batch.stream, std::mem::take(&mut chunk), next, None);
                chunk_bytes = 0;
            }
            chunk_bytes += len;
            chunk.push(record);
            if n + 1 == total {
                self.push_batch(key, batch.stream, std::mem::take(&mut chunk), end, batch.checkpoint.clone());
            }
        }
        if self.cfg.mutations.has(Mutation::AckBeforeCommit) {
            self.sources[source.0 as usize].acks.insert(key.partition, end);
        }
        if self.cfg.mutations.has(Mutation::OffsetsBeforeCommit) {
            let records = self.committed.partitions.get(&key).map_or(0, |p| p.records) + total as u64;
            let value = OffsetValue { position: end, lsn: self.wal.next_lsn, records };
            let entry = OffsetEntry { key, value, checkpoint: batch.checkpoint };
            self.io(Pending::OffsetsWriteEarly, IoOp::OffsetsWrite { entries: vec![entry] });
        }
        Ok(())
    }

    pub(super) fn push_batch(
        &mut self,
        key: PartitionKey,
        stream: StreamId,
        records: Vec<Record>,
        end: Position,
        checkpoint: Option<Vec<u8>>,
    ) {
        let frame = Frame::SourceBatch(SourceBatch { key, stream, end, checkpoint, records });
        self.push_frame(frame);
    }

    pub(super) fn push_frame(&mut self, frame: Frame) {
        self.pending_bytes += frame.encoded_len() as u64;
        self.pending.push_back(frame);
    }

    pub(super) fn write_offsets(&mut self) {
        // Like acks: a writer that may have lost the lease materializes
        // nothing more.
        if self.offsets_io.is_some() || self.offsets_dirty.is_empty() || !self.lease_ok() {
            return;
        }
        let entries = std::mem::take(&mut self.offsets_dirty)
            .into_iter()
            .map(|key| {
                let p = &self.committed.partitions[&key];
                let value = OffsetValue { position: p.position, lsn: p.lsn, records: p.records };
                let value = self.offsets_stale.remove(&key).unwrap_or(value);
                OffsetEntry { key, value, checkpoint: p.checkpoint.clone() }
            })
            .collect();
        let id = self.io(Pending::OffsetsWrite, IoOp::OffsetsWrite { entries });
        self.offsets_io = Some(id);
    }

    pub(super) fn send_acks(&mut self) {
        if !self.lease_ok() {
            return;
        }
        for i in 0..self.sources.len() {
            let s = &mut self.sources[i];
            if s.ack_io.is_some() || s.acks.is_empty() || !s.opened {
                continue;
            }
            let acks: Vec<(u32, Position)> = std::mem::take(&mut s.acks).into_iter().collect();
            s.acks_sent.clone_from(&acks);
            let source = SourceId(i as u16);
            let id = self.io(Pending::SourceAck(source), IoOp::SourceAck { source, acks });
            self.sources[i].ack_io = Some(id);
        }
    }
}
