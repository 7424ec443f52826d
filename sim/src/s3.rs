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
//! its groups. A listing only lists; the engine finishes deletions a crash
//! interrupted. The layout rules are core's (`skippr_core::format::objects`),
//! the same the real driver uses.

use skippr_core::format::{lay_out, split_leftovers, taken_key};
use skippr_core::{IoError, LeaseRow, SegmentId, WalListing};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone, Default)]
pub struct SimS3 {
    objects: BTreeMap<(SegmentId, u64), Arc<Vec<u8>>>,
    pub overwrites: u64,
    /// Bumped by every change to the objects: equal counts, equal buckets.
    changes: u64,
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
            Some(existing) if conditional => taken_key(existing, bytes),
            Some(existing) if existing == bytes => Ok(()),
            Some(_) => {
                self.overwrites += 1;
                self.changes += 1;
                self.objects.insert((segment, offset), bytes.clone());
                Ok(())
            }
            None => {
                self.changes += 1;
                self.objects.insert((segment, offset), bytes.clone());
                Ok(())
            }
        }
    }

    /// Every segment with the offsets of its objects, as the driver lists.
    pub fn list(&self) -> WalListing {
        WalListing::Objects(self.offsets())
    }

    fn offsets(&self) -> BTreeMap<SegmentId, Vec<u64>> {
        let mut listed: BTreeMap<SegmentId, Vec<u64>> = BTreeMap::new();
        for (s, off) in self.objects.keys() {
            listed.entry(*s).or_default().push(*off);
        }
        listed
    }

    /// The segments that still belong to the WAL, by the engine's rule.
    pub fn wal_segments(&self) -> Vec<SegmentId> {
        split_leftovers(&self.offsets()).1
    }

    /// The segment's bytes: each object at its offset, zeros in any gap.
    /// Overlapping objects cannot be laid out: the read fails.
    pub fn read(&self, segment: SegmentId) -> Result<Vec<u8>, IoError> {
        let objects = self.objects.range((segment, 0)..(SegmentId(segment.0 + 1), 0));
        lay_out(objects.map(|((_, offset), bytes)| (*offset, bytes.as_slice()))).map_err(|_| IoError::Failed)
    }

    /// The object at (segment, offset), or a 404.
    fn object(&self, segment: SegmentId, offset: u64) -> Result<Vec<u8>, IoError> {
        self.objects.get(&(segment, offset)).map(|b| b.to_vec()).ok_or(IoError::Failed)
    }

    /// The object at `offset` and those after it, each keyed by where the
    /// one before ends, until they make `len` bytes (a read-back of
    /// consecutive groups, as the driver does it).
    pub fn objects_from(&self, segment: SegmentId, offset: u64, len: u64) -> Result<Vec<u8>, IoError> {
        let mut bytes = self.object(segment, offset)?;
        while (bytes.len() as u64) < len {
            let next = self.object(segment, offset + bytes.len() as u64)?;
            if next.is_empty() {
                break;
            }
            bytes.extend_from_slice(&next);
        }
        Ok(bytes)
    }

    pub fn delete_header(&mut self, segment: SegmentId) {
        self.changes += self.objects.remove(&(segment, 0)).is_some() as u64;
    }

    pub fn delete_rest(&mut self, segment: SegmentId) {
        let before = self.objects.len();
        self.objects.retain(|(s, _), _| *s != segment);
        self.changes += (self.objects.len() != before) as u64;
    }

    pub fn changes(&self) -> u64 {
        self.changes
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
    fn listing_lists_everything_and_deletes_nothing() {
        let mut s3 = SimS3::default();
        for seg in 1..=3 {
            s3.put(SegmentId(seg), 0, &b(b"h"), true).unwrap();
            s3.put(SegmentId(seg), 32, &b(b"g"), true).unwrap();
        }
        s3.delete_header(SegmentId(1));
        s3.delete_header(SegmentId(3));
        let listed = [(SegmentId(1), vec![32]), (SegmentId(2), vec![0, 32]), (SegmentId(3), vec![32])];
        assert_eq!(s3.list(), WalListing::Objects(listed.into_iter().collect()));
        assert_eq!(s3.objects(), 4, "a listing sweeps nothing");
        assert_eq!(s3.wal_segments(), vec![SegmentId(2), SegmentId(3)], "1 was being deleted; 3 is a hole, kept");
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
