//! `raft::Storage` over part `Log`: terms and entries answered from memory,
//! older entries "temporarily unavailable" until read back, snapshots as
//! manifests of the segments that hold the log through an index.

use super::Log;
use raft::eraftpb::{Entry, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};

fn store_err(e: StorageError) -> raft::Error {
    raft::Error::Store(e)
}

impl raft::Storage for Log {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard.clone(), self.conf.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into();
        if low <= self.base.0 {
            return Err(store_err(StorageError::Compacted));
        }
        assert!(high <= self.last_index() + 1, "raft-rs asks within the log");
        let mut out = Vec::new();
        let mut next = low;
        if low < self.held_from {
            let mut fetch = self.fetch.borrow_mut();
            match &fetch.got {
                Some((from, got)) if *from <= low && from + got.len() as u64 > low => {
                    let skip = (low - from) as usize;
                    out.extend(got.iter().skip(skip).take((high - low) as usize).cloned());
                    next = low + out.len() as u64;
                }
                _ if context.can_async() => {
                    let end = self.fetch_end(low, high.min(self.held_from), max_size);
                    fetch.wanted.push((low, end, context));
                    return Err(store_err(StorageError::LogTemporarilyUnavailable));
                }
                _ => return Err(store_err(StorageError::Unavailable)),
            }
        }
        if next < high && next >= self.held_from {
            let at = (next - self.held_from) as usize;
            out.extend(self.held.range(at..(high - self.held_from) as usize).cloned());
        }
        raft::util::limit_size(&mut out, max_size);
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.base.0 {
            return Err(store_err(StorageError::Compacted));
        }
        self.terms.term(idx).ok_or(store_err(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.base.0 + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(Log::last_index(self))
    }

    /// A snapshot at the last index applied and durable here, as a
    /// manifest. Not while a membership change past that index is applied
    /// (the configuration sent must be the one at the index): raft-rs asks
    /// again later.
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let index = self.durable;
        if index < request_index || index < self.base.0 || self.conf_changed_at > index {
            return Err(store_err(StorageError::SnapshotTemporarilyUnavailable));
        }
        let manifest = self.manifest(index);
        let mut snap = Snapshot { data: manifest.encode().into(), ..Snapshot::default() };
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = manifest.term;
        meta.set_conf_state(self.conf.clone());
        Ok(snap)
    }
}
