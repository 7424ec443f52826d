//! Clustered mode on the local disk: a raft `Ready` made durable
//! (`WalOp::Replicate`) and the hard-state file read and written as the
//! engine asks. The engine decides every byte and place; this file only
//! performs the steps in the order `Replicate` gives, each durable before
//! the next.

use super::DiskWal;
use crate::hard_state_file::FILE_NAME as HARD_STATE_FILE;
use skippr_core::cluster::FILE_BYTES;
use skippr_core::format::encode_header;
use skippr_core::Replicate;
use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

impl DiskWal {
    /// One `Ready`: the conflicting tail's segments removed (newest first,
    /// each removal durable), its groups in the first kept segment zeroed
    /// (newest first, each synced), the new groups written (creating the
    /// segments they open, zeroed through, header first) and synced once
    /// per file touched, then the hard state's slot written and synced.
    pub fn replicate(&self, r: &Replicate) -> io::Result<()> {
        for segment in &r.remove {
            self.delete(*segment)?;
        }
        for p in &r.zero {
            let file = OpenOptions::new().write(true).open(self.path(p.segment))?;
            file.write_all_at(&vec![0; p.len as usize], p.offset)?;
            file.sync_data()?;
        }
        let mut touched = BTreeSet::new();
        for g in &r.groups {
            if let Some(o) = g.opens {
                self.create(g.place.segment, &encode_header(g.place.segment, o.epoch), o.segment_bytes)?;
            }
            self.write_at(g.place.segment, g.place.offset, &g.bytes)?;
            touched.insert(g.place.segment);
        }
        for segment in touched {
            self.sync_segment(segment)?;
        }
        if let Some((at, slot)) = &r.hard_state {
            self.write_hard_state(*at, slot)?;
        }
        Ok(())
    }

    /// The hard-state file's bytes: zeros where there is none (a DATA_DIR
    /// never initialized, or wiped: the engine refuses it).
    pub fn read_hard_state(&self) -> io::Result<Vec<u8>> {
        match std::fs::read(self.data_dir.join(HARD_STATE_FILE)) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(vec![0; FILE_BYTES]),
            Err(e) => Err(e),
        }
    }

    /// One slot of the hard-state file, written in place and synced. The
    /// file exists: `cluster init` or `join` made it, and the engine saves
    /// nothing before it has read a state from it.
    pub fn write_hard_state(&self, at: u64, slot: &[u8]) -> io::Result<()> {
        let mut file = self.hard_state.lock().expect("not poisoned");
        if file.is_none() {
            let path = self.data_dir.join(HARD_STATE_FILE);
            *file = Some(OpenOptions::new().write(true).mode(0o600).open(&path).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("{}: {e} (was this DATA_DIR given `skipprd cluster init`?)", path.display()),
                )
            })?);
        }
        let f: &File = file.as_ref().expect("set above");
        f.write_all_at(slot, at)?;
        if crate::planted::armed(crate::planted::DriverFault::HardStateUnsynced) {
            return Ok(());
        }
        f.sync_data()
    }

    /// Forgets open descriptors, after the files under them were replaced.
    pub(super) fn forget_open_files(&self) {
        *self.open.lock().expect("not poisoned") = None;
        *self.hard_state.lock().expect("not poisoned") = None;
    }

    /// Bytes of a segment as the page cache holds them: `len` from
    /// `offset`, or fewer at the file's end (a snapshot's transfer).
    pub fn read_range(&self, segment: skippr_core::SegmentId, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let file = File::open(self.path(segment))?;
        let size = file.metadata()?.len();
        let len = len.min(size.saturating_sub(offset) as usize);
        let mut bytes = vec![0; len];
        file.read_exact_at(&mut bytes, offset)?;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use skippr_core::format::GroupPlace;
    use skippr_core::testing::{EntryGroup, Opening};
    use skippr_core::{Epoch, Lsn, SegmentId};

    fn group(segment: u64, offset: u64, bytes: &'static [u8], opens: bool) -> EntryGroup {
        let place = GroupPlace { lsn: Lsn(offset), segment: SegmentId(segment), offset, len: bytes.len() as u64 };
        let opens = opens.then_some(Opening { epoch: Epoch(2), segment_bytes: 4096 });
        EntryGroup { place, opens, sealed: false, bytes: Bytes::from_static(bytes) }
    }

    fn replicate(groups: Vec<EntryGroup>) -> Replicate {
        Replicate { remove: vec![], zero: vec![], groups, hard_state: None }
    }

    #[test]
    fn a_ready_is_written_in_order_truncations_first_and_the_hard_state_last() {
        let tmp = tempfile::tempdir().unwrap();
        let wal = DiskWal::open(tmp.path()).unwrap();
        assert_eq!(wal.read_hard_state().unwrap(), vec![0; FILE_BYTES], "no file: no state");
        assert!(wal.write_hard_state(0, b"x").is_err(), "never a hard state the host was not given");
        std::fs::write(tmp.path().join(HARD_STATE_FILE), vec![0; FILE_BYTES]).unwrap();
        wal.replicate(&replicate(vec![group(1, 32, b"first", true), group(1, 37, b"second", false)])).unwrap();
        wal.replicate(&replicate(vec![group(2, 32, b"third", true)])).unwrap();
        let one = wal.read(SegmentId(1)).unwrap();
        assert_eq!(one.len(), 4096);
        assert_eq!(&one[..32], &encode_header(SegmentId(1), Epoch(2))[..]);
        assert_eq!(&one[32..43], b"firstsecond");
        // raft replaces the tail after "first": segment 2 goes, "second" is
        // zeroed, the new group takes its place, and the hard state follows.
        let truncate = Replicate {
            remove: vec![SegmentId(2)],
            zero: vec![GroupPlace { lsn: Lsn(37), segment: SegmentId(1), offset: 37, len: 6 }],
            groups: vec![group(1, 37, b"other", false)],
            hard_state: Some((100, b"state".to_vec())),
        };
        wal.replicate(&truncate).unwrap();
        assert_eq!(wal.list().unwrap().0, vec![SegmentId(1)]);
        let one = wal.read(SegmentId(1)).unwrap();
        assert_eq!(&one[32..44], b"firstother\0\0");
        let state = wal.read_hard_state().unwrap();
        assert_eq!(&state[100..105], b"state");
        assert_eq!(wal.read_range(SegmentId(1), 4090, 100).unwrap().len(), 6, "a range stops at the file's end");
    }
}
