//! Simulated S3 and the DynamoDB lease row, as the S3 WAL driver uses them.
//!
//! The object layout is the real driver's: a segment is a header object at
//! offset 0 and one object per commit group at the group's byte offset, each
//! created only if absent (`If-None-Match: *`). Objects never rot or tear
//! (S3 checksums them); what can go wrong is at the API: outcomes that are
//! unknown (the effect happened, will happen later, or never does), 5xx and
//! throttling, slow requests. A put that finds its key taken is compared the
//! way the driver compares it: the same bytes are a success, different bytes
//! a conflict.
//!
//! Deleting a segment removes its header first (the one atomic step), then
//! its groups; a listing finishes deletions that a crash interrupted, but
//! only for headerless segments older than every segment with a header, so a
//! hole in the middle of the WAL is still read (and reported) rather than
//! swept away.

use skippr_core::wal::oldest_to_keep;
use skippr_core::{IoError, LeaseRow, SegmentId};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone, Default)]
pub struct SimS3 {
    objects: BTreeMap<(SegmentId, u64), Arc<Vec<u8>>>,
    pub overwrites: u64,
}

impl SimS3 {
    /// A put of `bytes` at `(segment, offset)`; `conditional` is
    /// `If-None-Match: *`. Returns what the driver would report.
    pub fn put(
        &mut self,
        segment: SegmentId,
        offset: u64,
        bytes: &Arc<Vec<u8>>,
        conditional: bool,
    ) -> Result<(), IoError> {
        match self.objects.get(&(segment, offset)) {
            Some(existing) if existing == bytes => Ok(()),
            Some(_) if conditional => Err(IoError::Conflict),
            Some(_) => {
                self.overwrites += 1;
                self.objects.insert((segment, offset), bytes.clone());
                Ok(())
            }
            None => {
                self.objects.insert((segment, offset), bytes.clone());
                Ok(())
            }
        }
    }

    /// The WAL's segments, after sweeping leftovers below the oldest one
    /// that still counts (`skippr_core::wal::oldest_to_keep`).
    pub fn list(&mut self) -> Vec<SegmentId> {
        let mut listed: BTreeMap<SegmentId, Vec<u64>> = BTreeMap::new();
        for (s, off) in self.objects.keys() {
            listed.entry(*s).or_default().push(*off);
        }
        if let Some(keep) = oldest_to_keep(&listed) {
            self.objects.retain(|(s, _), _| *s >= keep);
        }
        let mut all: Vec<SegmentId> = self.objects.keys().map(|(s, _)| *s).collect();
        all.dedup();
        all
    }

    /// The segment's bytes: each object at its offset, zeros in any gap.
    /// Overlapping objects cannot be laid out: the read fails.
    pub fn read(&self, segment: SegmentId) -> Result<Vec<u8>, IoError> {
        let mut out = Vec::new();
        for ((_, offset), bytes) in self.objects.range((segment, 0)..(SegmentId(segment.0 + 1), 0)) {
            let at = *offset as usize;
            if at < out.len() {
                return Err(IoError::Failed);
            }
            out.resize(at, 0);
            out.extend_from_slice(bytes);
        }
        Ok(out)
    }

    pub fn delete_header(&mut self, segment: SegmentId) {
        self.objects.remove(&(segment, 0));
    }

    pub fn delete_rest(&mut self, segment: SegmentId) {
        self.objects.retain(|(s, _), _| *s != segment);
    }

    pub fn objects(&self) -> usize {
        self.objects.len()
    }
}

/// The lease row, written only under its version condition.
#[derive(Clone, Default)]
pub struct SimLease {
    pub row: Option<LeaseRow>,
}

impl SimLease {
    pub fn write(&mut self, expected: Option<u64>, row: LeaseRow) -> Result<(), IoError> {
        if self.row.map(|r| r.version) != expected {
            return Err(IoError::Conflict);
        }
        self.row = Some(row);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(v: &[u8]) -> Arc<Vec<u8>> {
        Arc::new(v.to_vec())
    }

    #[test]
    fn a_conditional_put_keeps_the_first_bytes() {
        let mut s3 = SimS3::default();
        assert_eq!(s3.put(SegmentId(1), 0, &b(b"head"), true), Ok(()));
        assert_eq!(s3.put(SegmentId(1), 0, &b(b"head"), true), Ok(()), "a retry of the same bytes succeeds");
        assert_eq!(s3.put(SegmentId(1), 0, &b(b"other"), true), Err(IoError::Conflict));
        assert_eq!(s3.read(SegmentId(1)).unwrap(), b"head");
        assert_eq!(s3.put(SegmentId(1), 0, &b(b"other"), false), Ok(()));
        assert_eq!(s3.read(SegmentId(1)).unwrap(), b"other", "an unconditional put overwrites");
    }

    #[test]
    fn reads_fill_gaps_and_refuse_overlaps() {
        let mut s3 = SimS3::default();
        s3.put(SegmentId(2), 0, &b(b"hh"), true).unwrap();
        s3.put(SegmentId(2), 4, &b(b"gg"), true).unwrap();
        assert_eq!(s3.read(SegmentId(2)).unwrap(), b"hh\0\0gg");
        s3.put(SegmentId(2), 5, &b(b"xx"), true).unwrap();
        assert_eq!(s3.read(SegmentId(2)), Err(IoError::Failed));
    }

    #[test]
    fn listing_sweeps_leftovers_below_the_oldest_data_segment() {
        let mut s3 = SimS3::default();
        for seg in 1..=3 {
            s3.put(SegmentId(seg), 0, &b(b"h"), true).unwrap();
            s3.put(SegmentId(seg), 32, &b(b"g"), true).unwrap();
        }
        s3.delete_header(SegmentId(1));
        s3.delete_header(SegmentId(3));
        assert_eq!(s3.list(), vec![SegmentId(2), SegmentId(3)], "1 was being deleted; 3 is a hole, kept");
        assert_eq!(s3.objects(), 3);
        // A creation put of a deleted segment that lands late brings back a
        // header alone: a leftover below the data, not a spare.
        s3.put(SegmentId(1), 0, &b(b"h"), true).unwrap();
        s3.put(SegmentId(4), 0, &b(b"h"), true).unwrap();
        assert_eq!(s3.list(), vec![SegmentId(2), SegmentId(3), SegmentId(4)], "4 is a spare");
        // Nothing but headerless groups: all leftovers.
        let mut empty = SimS3::default();
        empty.put(SegmentId(7), 32, &b(b"g"), true).unwrap();
        assert_eq!(empty.list(), vec![]);
    }

    #[test]
    fn lease_writes_are_conditional_on_the_version() {
        let mut lease = SimLease::default();
        let row = |version| LeaseRow { generation: 1, holder: 7, version };
        assert_eq!(lease.write(Some(1), row(1)), Err(IoError::Conflict));
        assert_eq!(lease.write(None, row(1)), Ok(()));
        assert_eq!(lease.write(None, row(2)), Err(IoError::Conflict));
        assert_eq!(lease.write(Some(1), row(2)), Ok(()));
    }
}
