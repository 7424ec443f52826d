//! The raft hard-state file on disk (`DATA_DIR/raft-state`, mode 0600): the
//! two slots of `skippr_core::cluster::hard_state`, each save a
//! positioned write into the slot that does not hold the current state,
//! then `fdatasync`. A crash mid-write leaves the other slot, so opening
//! always finds the last state that was saved in full. Clustered mode only
//! (issue #12, in progress).
//!
//! `skipprd cluster init` and `cluster join` create the file (`init`) with
//! its first state, which names the cluster and this host's node id; a
//! host without the file has no cluster identity and takes no part.

use crate::disk_wal::sync_dir;
use skippr_core::cluster::{decode_file, encode_slot, slot_offset, Members, Saved, FILE_BYTES};
use skippr_core::cluster::{ConfState, HardState};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub const FILE_NAME: &str = "raft-state";

pub struct HardStateFile {
    file: File,
    path: PathBuf,
    next_seq: u64,
}

impl HardStateFile {
    /// Creates the file in `dir` holding `bytes` (`hard_state::first_file`),
    /// mode 0600, file and directory synced. Refused if the file exists: a
    /// DATA_DIR belongs to one node of one cluster.
    pub fn init(dir: &Path, bytes: &[u8]) -> io::Result<()> {
        assert_eq!(bytes.len(), FILE_BYTES, "a whole hard-state file");
        let path = dir.join(FILE_NAME);
        let fresh = OpenOptions::new().create_new(true).write(true).mode(0o600).open(&path).map_err(|e| {
            let what = match e.kind() {
                io::ErrorKind::AlreadyExists => "it already belongs to a cluster node".to_string(),
                _ => e.to_string(),
            };
            io::Error::new(e.kind(), format!("{}: {what}", path.display()))
        })?;
        fresh.write_all_at(bytes, 0)?;
        fresh.sync_all()?;
        sync_dir(dir)
    }

    /// Opens the file in `dir` and reads the current state (`None` for a
    /// file of zeros). A missing file is `NotFound`; one with no valid
    /// slot is an error that names it: the host must not vote without
    /// knowing its term and vote.
    pub fn open(dir: &Path) -> io::Result<(HardStateFile, Option<Saved>)> {
        let path = dir.join(FILE_NAME);
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let bytes = std::fs::read(&path)?;
        let saved = decode_file(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
        let next_seq = saved.as_ref().map_or(0, |s| s.seq + 1);
        Ok((HardStateFile { file, path, next_seq }, saved))
    }

    /// Saves the state durably in the slot the current state is not in.
    pub fn save(&mut self, hard: &HardState, conf: &ConfState, members: &Members) -> io::Result<()> {
        let slot = encode_slot(self.next_seq, hard, conf, members)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {e}", self.path.display())))?;
        self.file.write_all_at(&slot, slot_offset(self.next_seq))?;
        self.file.sync_data()?;
        self.next_seq += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skippr_core::cluster::SLOT_BYTES;
    use std::os::unix::fs::PermissionsExt;

    fn hard(term: u64, vote: u64, commit: u64) -> HardState {
        HardState { term, vote, commit, ..Default::default() }
    }

    fn conf() -> ConfState {
        ConfState::from((vec![1, 2, 3], vec![]))
    }

    fn members() -> Members {
        Members { cluster: 9, node: 2, segment_bytes: 1 << 20, ..Members::default() }
    }

    #[test]
    fn saves_alternate_slots_and_the_last_full_save_is_found_again() {
        let tmp = tempfile::tempdir().unwrap();
        let e = HardStateFile::open(tmp.path()).err().expect("no file, no identity");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let first = skippr_core::cluster::first_file(&members(), &[1, 2, 3]).unwrap();
        HardStateFile::init(tmp.path(), &first).unwrap();
        let e = HardStateFile::init(tmp.path(), &first).unwrap_err().to_string();
        assert!(e.contains("already belongs to a cluster node"), "{e}");
        let (mut f, saved) = HardStateFile::open(tmp.path()).unwrap();
        let saved = saved.expect("init wrote the first state");
        assert_eq!((saved.seq, saved.members.node, saved.conf.voters.clone()), (1, 2, vec![1, 2, 3]));
        let path = tmp.path().join(FILE_NAME);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        for term in 1..=2 {
            f.save(&hard(term, 2, 10 * term), &conf(), &members()).unwrap();
        }
        drop(f);
        let (mut f, saved) = HardStateFile::open(tmp.path()).unwrap();
        let saved = saved.unwrap();
        assert_eq!((saved.seq, saved.hard.term, saved.hard.commit), (3, 2, 20));
        f.save(&hard(4, 1, 41), &conf(), &members()).unwrap();
        // A crash tore the next save (seq 4, slot 0): the previous stands.
        let mut bytes = std::fs::read(&path).unwrap();
        let torn = slot_offset(4) as usize;
        bytes[torn + 40..torn + SLOT_BYTES].fill(0xee);
        std::fs::write(&path, &bytes).unwrap();
        let (_, saved) = HardStateFile::open(tmp.path()).unwrap();
        assert_eq!(saved.unwrap().hard.term, 2, "seq 3, in the other slot");
    }

    #[test]
    fn a_file_with_no_valid_slot_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(FILE_NAME);
        std::fs::write(&path, vec![0x5a; FILE_BYTES]).unwrap();
        let e = HardStateFile::open(tmp.path()).err().expect("refused");
        assert!(e.to_string().contains("raft-state") && e.to_string().contains("damaged"), "{e}");
    }
}
