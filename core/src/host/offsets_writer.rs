//! Offsets materialization: the partitions whose committed value the
//! offsets store does not have yet (with that value), and the one write in
//! flight. The store is a cache of the WAL: it is written only from
//! committed positions, may lag the WAL and never lead it; a failed write
//! rewrites every partition. At recovery it checks what the store holds
//! against the WAL. Reads the committed state it is handed; talks only to
//! [`Effects`].

use super::effects::{Effects, Pending, Retry};
use crate::ids::*;
use crate::io::OffsetsOp;
use crate::io::{IoOp, OffsetEntry, OffsetRow, StopReason};
use crate::offsets::OffsetValue;
use crate::state::{CommittedState, PartitionState};
use std::collections::BTreeMap;

#[derive(Default)]
pub(super) struct OffsetsWriter {
    /// Per partition, the value to write next.
    dirty: BTreeMap<PartitionKey, OffsetValue>,
    /// The write in flight, or the failed one while its retry waits.
    io: Option<IoId>,
}

/// What the store held at recovery, against the WAL.
pub(super) enum StoreCheck {
    Consistent,
    /// A value is not 24 bytes: the store is damaged or someone else's.
    Malformed(StopReason),
    /// The store is ahead of the WAL (unless a newer writer moved it).
    Ahead(StopReason),
}

fn value(p: &PartitionState) -> OffsetValue {
    OffsetValue { position: p.position, lsn: p.lsn, records: p.records }
}

impl OffsetsWriter {
    /// A group that moved `key` committed. `keep_first` is the planted bug
    /// `offsets-stale-value`: the first value of a run of commits stays.
    pub(super) fn committed(&mut self, key: PartitionKey, p: &PartitionState, keep_first: bool) {
        if keep_first {
            self.dirty.entry(key).or_insert(value(p));
        } else {
            self.dirty.insert(key, value(p));
        }
    }

    /// Recovery, once the fence is in: the store may lag the WAL, never
    /// lead it; partitions it lags on are written again.
    pub(super) fn check_store(&mut self, entries: Vec<OffsetRow>, committed: &CommittedState) -> StoreCheck {
        let mut stored = BTreeMap::new();
        for (key, bytes, _checkpoint) in entries {
            let Ok(value) = OffsetValue::decode(&bytes) else {
                return StoreCheck::Malformed(StopReason::OffsetsMalformed { key, len: bytes.len() });
            };
            stored.insert(key, value);
        }
        for (key, value) in &stored {
            let wal = committed.partitions.get(key).map(|p| p.position).unwrap_or_default();
            if value.position > wal {
                return StoreCheck::Ahead(StopReason::OffsetsAheadOfWal { key: *key, store: value.position, wal });
            }
        }
        for (key, p) in &committed.partitions {
            if stored.get(key).is_none_or(|v| v.lsn < p.lsn || v.position != p.position) {
                self.dirty.insert(*key, value(p));
            }
        }
        StoreCheck::Consistent
    }

    /// Writes every partition that moved, in one request, one at a time.
    pub(super) fn write(&mut self, fx: &mut Effects, committed: &CommittedState) {
        if self.io.is_some() || self.dirty.is_empty() {
            return;
        }
        let entries = std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|(key, value)| OffsetEntry { key, value, checkpoint: committed.partitions[&key].checkpoint.clone() })
            .collect();
        self.io = Some(fx.io(Pending::OffsetsWrite, IoOp::Offsets(OffsetsOp::Write { entries })));
    }

    pub(super) fn on_written(&mut self, fx: &mut Effects, id: IoId, ok: bool, committed: &CommittedState) {
        self.io = None;
        if ok {
            fx.succeeded(Retry::OffsetsWrite);
            return;
        }
        // Offsets are a cache of the WAL: rewrite everything later.
        for (key, p) in &committed.partitions {
            self.dirty.insert(*key, value(p));
        }
        self.io = Some(id);
        fx.retry_later(Retry::OffsetsWrite);
    }

    pub(super) fn retry(&mut self) {
        self.io = None;
    }

    /// The planted bug `offsets-before-commit`: writes a position that is
    /// only pending.
    pub(super) fn write_early(&mut self, fx: &mut Effects, entry: OffsetEntry) {
        fx.io(Pending::OffsetsWriteEarly, IoOp::Offsets(OffsetsOp::Write { entries: vec![entry] }));
    }

    pub(super) fn idle(&self) -> bool {
        self.dirty.is_empty() && self.io.is_none()
    }
}
