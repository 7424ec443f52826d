//! The coordinator's side of a source batch on its way in: the sources part
//! reads it, the schema part decides whether it may pass, the sources part
//! turns it into frames, and the WAL writer queues them for the next group.
//! Owns no state. The planted bugs `ack-before-commit` and
//! `offsets-before-commit` hook in here.

use super::*;
use crate::admit::quarantines;
use crate::offsets::OffsetValue;
use schema::Decided;

impl Host {
    pub(super) fn on_source_read(&mut self, source: SourceId, result: Result<(Vec<SourceBatchIn>, bool), IoError>) {
        let Some((mut batches, exhausted)) = self.sources.on_read(&mut self.fx, source, result) else { return };
        // A record that breaks an intake rule stops the daemon before
        // anything of its read is taken in (the next start reads it again,
        // unless an operator gave it up with `--skip-input`), or, with dead
        // letters on, is committed quarantined: compaction sends it to the
        // dead letters, never to a sink.
        let letters = self.cfg.dead_letters.is_some();
        if let Some(fault) = batches.iter().flat_map(|b| &b.faults).find(|f| !quarantines(&f.fault, letters)) {
            return self.stop(StopReason::SourceRefused { source, why: fault.why.clone() });
        }
        let at_ms = self.wall_ms();
        for batch in &mut batches {
            quarantine_faults(batch, at_ms);
        }
        if self.cfg.stop_when_exhausted && self.sources.all_exhausted() {
            self.on_shutdown();
        }
        // A window's close or restart is news too: read on at once.
        let any = batches.iter().any(|b| !b.records.is_empty() || b.window != Window::None);
        for batch in batches {
            if let Err(stop) = self.accept(source, batch) {
                return self.stop(stop);
            }
        }
        if !any && !exhausted {
            self.sources.poll_later(&mut self.fx, source, self.cfg.limits.source_poll);
        }
    }

    /// Takes a source batch in, once its stream's schema is decided: a batch
    /// under a schema the WAL has no decision for waits (with every later
    /// batch of its stream) while the schema plugin is asked.
    fn accept(&mut self, source: SourceId, batch: SourceBatchIn) -> Result<(), StopReason> {
        if batch.stream.0 as usize >= self.cfg.streams.len() {
            let what = "unknown stream";
            return Err(StopReason::SourceProtocol { source, partition: batch.partition, what });
        }
        let Some((mut batch, decision)) = self.schemas.gate(&mut self.fx, source, batch, self.cfg.schema_plugin) else {
            return Ok(()); // held until the schema plugin decides
        };
        match decision {
            Ok(Some(frame)) => self.wal.push(frame),
            Ok(None) => {}
            Err(reason) => {
                // Under a schema the plugin refused: every record
                // quarantined (once: one refused at intake already is).
                let at_ms = self.wall_ms();
                for record in batch.records.iter_mut().filter(|r| crate::dead_letters::quarantined(&r.bytes).is_none())
                {
                    record.bytes = crate::dead_letters::quarantine(at_ms, &reason, &record.bytes);
                }
            }
        }
        let accept_resent = self.cfg.mutations.has(Mutation::AcceptResentRecords);
        let admitted =
            self.sources.admit(&self.cfg, &self.committed, &mut self.windows, source, batch, accept_resent)?;
        let Some(admitted) = admitted else { return Ok(()) };
        for frame in admitted.frames {
            self.wal.push(frame);
        }
        if admitted.windowed {
            return Ok(());
        }
        if self.cfg.mutations.has(Mutation::AckBeforeCommit) {
            self.sources.committed(admitted.key, admitted.end);
        }
        if self.cfg.mutations.has(Mutation::OffsetsBeforeCommit) {
            let key = admitted.key;
            let records = self.committed.partitions.get(&key).map_or(0, |p| p.records) + admitted.records;
            let value = OffsetValue { position: admitted.end, lsn: self.wal.next_lsn(), records };
            let entry = OffsetEntry { key, value, checkpoint: admitted.checkpoint };
            self.offsets.write_early(&mut self.fx, entry);
        }
        Ok(())
    }

    /// The wall clock's time now, in milliseconds since the Unix epoch, as
    /// the engine keeps it in the WAL's decisions.
    pub(super) fn wall_ms(&self) -> u64 {
        self.cfg.wall_origin_ms.saturating_add(self.fx.now.as_micros() / 1_000)
    }

    /// The schema plugin answered: commit the decision, then let the waiting
    /// batches in, in order (a later one may carry yet another schema). A
    /// refusal with dead letters on lets them in too, quarantined.
    pub(super) fn on_schema_decided(&mut self, stream: StreamId, result: Result<(bool, String), IoError>) {
        let letters = self.cfg.dead_letters.is_some();
        match self.schemas.on_decided(&mut self.fx, stream, result, letters) {
            Decided::Retry => {}
            Decided::Rejected(stop) => self.stop(stop),
            Decided::Refused(batches) => {
                for (source, batch) in batches {
                    if let Err(stop) = self.accept(source, batch) {
                        return self.stop(stop);
                    }
                }
            }
            Decided::Accepted { decision, batches } => {
                self.wal.push(*decision);
                for (source, batch) in batches {
                    if let Err(stop) = self.accept(source, batch) {
                        return self.stop(stop);
                    }
                }
            }
        }
    }
}

/// Wraps each record of `batch` that breaks an intake rule as quarantined
/// (`dead_letters::quarantine`), the decision made at `at_ms`.
fn quarantine_faults(batch: &mut SourceBatchIn, at_ms: u64) {
    for fault in std::mem::take(&mut batch.faults) {
        let Ok(i) = batch.records.binary_search_by_key(&fault.position, |r| r.position) else {
            continue; // a source's mistake: admission names it
        };
        let record = &mut batch.records[i];
        let reason = format!("{}: {}", crate::dead_letters::AT_INTAKE, fault.fault);
        record.bytes = crate::dead_letters::quarantine(at_ms, &reason, &record.bytes);
    }
}
