//! A snapshot's install on the local disk (clustered mode). The segments a
//! manifest names arrive from the leader in chunks into a staging area,
//! `DATA_DIR/install/` (`wal/` beside a copy of the manifest), which a
//! transfer interrupted by a reconnect or a restart resumes: a staged
//! segment's length is how much of it has arrived. Once every segment is
//! whole, the staging is checked (`check_install`), a new hard-state file
//! is written beside it, and one rename (`install/` → `install.ready/`)
//! commits the install. Rolling it forward swaps the directories and the
//! hard-state file; each step is recognisable from what exists, so a crash
//! anywhere leaves the old WAL and hard state, or the commit, which the
//! next start (`finish_install`) completes. Never a mix.

use super::{list_dir, sync_dir, DiskWal, WAL_DIR};
use crate::hard_state_file::FILE_NAME as HARD_STATE_FILE;
use skippr_core::cluster::{check_install, Manifest};
use skippr_core::SegmentId;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use tracing::info;

pub const INSTALL_DIR: &str = "install";
const READY_DIR: &str = "install.ready";
const MANIFEST_FILE: &str = "manifest";
/// Where the old WAL is set aside while an install swaps the new one in.
const SET_ASIDE_WAL: &str = "wal.old";

/// Why an install did not happen. The old WAL and hard state are intact.
#[derive(Debug)]
pub enum InstallError {
    Io(io::Error),
    /// The staged segments are not what the manifest names (a segment
    /// short, a scan that fails); the staging was discarded.
    Check(&'static str),
}

impl std::fmt::Display for InstallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InstallError::Io(e) => write!(f, "{e}"),
            InstallError::Check(what) => write!(f, "{what}"),
        }
    }
}

impl From<io::Error> for InstallError {
    fn from(e: io::Error) -> InstallError {
        InstallError::Io(e)
    }
}

/// The staging area of one manifest.
pub struct Staging {
    dir: PathBuf,
    manifest: Manifest,
}

impl Staging {
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn path(&self, segment: SegmentId) -> PathBuf {
        self.dir.join(WAL_DIR).join(format!("{:020}.seg", segment.0))
    }

    /// Per segment still incomplete: its id, the bytes staged, the bytes
    /// the manifest names.
    pub fn missing(&self) -> io::Result<Vec<(SegmentId, u64, u64)>> {
        let mut missing = Vec::new();
        for s in &self.manifest.segments {
            let have = std::fs::metadata(self.path(s.id))?.len();
            if have < s.bytes {
                missing.push((s.id, have, s.bytes));
            }
        }
        Ok(missing)
    }

    /// Appends a chunk of `segment` at `offset`, which must be where its
    /// staged bytes end (a chunk that arrives twice is ignored).
    pub fn write(&self, segment: SegmentId, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let wanted = self
            .manifest
            .segments
            .iter()
            .find(|s| s.id == segment)
            .ok_or_else(|| io::Error::other(format!("segment {} is not in the snapshot's manifest", segment.0)))?;
        if offset + bytes.len() as u64 > wanted.bytes {
            return Err(io::Error::other(format!("a chunk past the snapshot's bytes of segment {}", segment.0)));
        }
        let file = OpenOptions::new().write(true).open(self.path(segment))?;
        let have = file.metadata()?.len();
        if offset + bytes.len() as u64 <= have {
            return Ok(());
        }
        if offset != have {
            return Err(io::Error::other(format!(
                "a chunk of segment {} at {offset}, where {have} bytes are staged",
                segment.0
            )));
        }
        file.write_all_at(bytes, offset)
    }
}

impl DiskWal {
    /// The staging area for `manifest`: the one left by an interrupted
    /// transfer of the same manifest, or a new one (another manifest's is
    /// discarded).
    pub fn stage(&self, manifest: &Manifest) -> io::Result<Staging> {
        let dir = self.data_dir.join(INSTALL_DIR);
        let staging = Staging { dir: dir.clone(), manifest: manifest.clone() };
        let encoded = manifest.encode();
        match std::fs::read(dir.join(MANIFEST_FILE)) {
            Ok(old) if old == encoded && dir.join(WAL_DIR).is_dir() => {
                for s in &manifest.segments {
                    if !staging.path(s.id).is_file() {
                        create_private(&staging.path(s.id))?;
                    }
                }
                return Ok(staging);
            }
            Ok(_) => std::fs::remove_dir_all(&dir)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if dir.exists() {
                    std::fs::remove_dir_all(&dir)?;
                }
            }
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(dir.join(WAL_DIR))?;
        set_private_dir(&dir)?;
        for s in &manifest.segments {
            create_private(&staging.path(s.id))?;
        }
        std::fs::write(dir.join(MANIFEST_FILE), &encoded)?;
        Ok(staging)
    }

    /// Installs a complete staging: each segment zero-filled to its size
    /// and synced, the whole checked against the manifest, the hard state
    /// `(offset, slot)` written into a copy of the current file, then the
    /// commit (one rename) and the swap. On `Ok` the WAL is the snapshot's.
    pub fn install(&self, staging: Staging, hard_state: &(u64, Vec<u8>)) -> Result<(), InstallError> {
        if let Some((segment, have, bytes)) = staging.missing()?.first() {
            return Err(InstallError::Io(io::Error::other(format!(
                "segment {} is not staged in full ({have} of {bytes} bytes)",
                segment.0
            ))));
        }
        let mut segments = Vec::with_capacity(staging.manifest.segments.len());
        for s in &staging.manifest.segments {
            let file = OpenOptions::new().read(true).write(true).open(staging.path(s.id))?;
            file.set_len(s.bytes)?;
            write_zeros(&file, s.bytes, s.size)?;
            file.sync_all()?;
            let mut bytes = vec![0; s.size as usize];
            file.read_exact_at(&mut bytes, 0)?;
            segments.push((s.id, bytes));
        }
        sync_dir(&staging.dir.join(WAL_DIR))?;
        let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(id, b)| (*id, b.as_slice())).collect();
        if let Err(what) = check_install(&staging.manifest, &refs) {
            std::fs::remove_dir_all(&staging.dir)?;
            return Err(InstallError::Check(what));
        }
        drop(segments);
        let mut file = self.read_hard_state()?;
        let (at, slot) = hard_state;
        let end = *at as usize + slot.len();
        if end > file.len() {
            return Err(InstallError::Io(io::Error::other("the hard state's slot lies past the file")));
        }
        file[*at as usize..end].copy_from_slice(slot);
        let staged_state = staging.dir.join(HARD_STATE_FILE);
        let out = OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&staged_state)?;
        out.write_all_at(&file, 0)?;
        out.sync_all()?;
        sync_dir(&staging.dir)?;
        std::fs::rename(&staging.dir, self.data_dir.join(READY_DIR))?;
        sync_dir(&self.data_dir)?;
        self.finish_install()?;
        Ok(())
    }

    /// Completes an install whose commit a crash interrupted (`open` calls
    /// it before anything else), or the one just committed: the staged
    /// WAL takes the place of the old one, the staged hard state the place
    /// of the old file, and the staging goes. Returns whether there was
    /// one. Every step is idempotent, made durable before the next, and
    /// recognisable from what exists.
    ///
    /// No directory moves between two directories: on the POSIX minimum
    /// each side of such a rename is durable with its own directory's sync,
    /// so a cut can leave a directory under both names (and deleting one
    /// would delete the other's files) or under neither. The old WAL is set
    /// aside within DATA_DIR (`wal` → `wal.old`, one directory's change),
    /// a new `wal` is made, and the staged segments and hard state are
    /// moved into place file by file, the destination synced before the
    /// source: a cut leaves each file under its new name, or under both
    /// (the same file, whose staged name is then unlinked), never neither.
    pub fn finish_install(&self) -> io::Result<bool> {
        let ready = self.data_dir.join(READY_DIR);
        if !ready.is_dir() {
            return Ok(false);
        }
        self.forget_open_files();
        let staged_wal = ready.join(WAL_DIR);
        let set_aside = self.data_dir.join(SET_ASIDE_WAL);
        if staged_wal.is_dir() {
            // While the staged WAL is there, `wal` is the old one until it
            // is set aside, and the new one after.
            if !set_aside.exists() && self.dir.exists() {
                std::fs::rename(&self.dir, &set_aside)?;
                sync_dir(&self.data_dir)?;
            }
            super::create_dir_durably(&self.dir, 0o700)?;
            for entry in std::fs::read_dir(&staged_wal)? {
                let name = entry?.file_name();
                move_file(&staged_wal.join(&name), &self.dir.join(&name))?;
            }
            sync_dir(&self.dir)?;
            sync_dir(&staged_wal)?;
            std::fs::remove_dir(&staged_wal)?;
            sync_dir(&ready)?;
        }
        let staged_state = ready.join(HARD_STATE_FILE);
        if staged_state.is_file() {
            move_file(&staged_state, &self.data_dir.join(HARD_STATE_FILE))?;
            sync_dir(&self.data_dir)?;
            sync_dir(&ready)?;
        }
        if set_aside.exists() {
            std::fs::remove_dir_all(&set_aside)?;
            sync_dir(&self.data_dir)?;
        }
        std::fs::remove_dir_all(&ready)?;
        sync_dir(&self.data_dir)?;
        let (segments, _) = list_dir(&self.dir)?;
        info!(segments = segments.len(), wal = %self.dir.display(), "a snapshot's segments replaced the WAL");
        Ok(true)
    }
}

/// Moves the file `from` to `to` (replacing a file there) in another
/// directory. Where a cut left it under both names already, the staged
/// name goes. The caller syncs `to`'s directory, then `from`'s.
fn move_file(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let same = match (std::fs::metadata(from), std::fs::metadata(to)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    };
    if same {
        // A rename between two names of one file does nothing (POSIX).
        std::fs::remove_file(from)
    } else {
        std::fs::rename(from, to)
    }
}

fn create_private(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(path)
}

fn set_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

fn write_zeros(file: &File, from: u64, to: u64) -> io::Result<()> {
    let chunk = vec![0u8; 1 << 20];
    let mut at = from;
    while at < to {
        let n = chunk.len().min((to - at) as usize);
        file.write_all_at(&chunk[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use skippr_core::cluster::ManifestSegment;
    use skippr_core::cluster::{Members, FILE_BYTES, SLOT_BYTES};
    use skippr_core::format::{encode_group, encode_header, Frame};
    use skippr_core::{Epoch, Lsn};

    /// A leader's segment 3: a snapshot group at LSN 11 (term 2), a fence
    /// at 12 (term 3), and a group past the snapshot at 13.
    fn leader_segment() -> (Vec<u8>, Manifest) {
        let id = SegmentId(3);
        let mut bytes = encode_header(id, Epoch(2));
        let state = skippr_core::testing::CommittedState::default();
        let snap = Frame::Snapshot(state.snapshot(false, &Default::default()));
        bytes.extend(encode_group(id, Epoch(2), Lsn(11), &[&snap]));
        bytes.extend(encode_group(id, Epoch(3), Lsn(12), &[&Frame::Fence]));
        let end = bytes.len() as u64;
        bytes.extend(encode_group(id, Epoch(3), Lsn(13), &[&Frame::Fence]));
        bytes.resize(8192, 0);
        let members = Members { cluster: 7, node: 2, segment_bytes: 8192, ..Members::default() };
        let segments = vec![ManifestSegment { id, bytes: end, size: 8192 }];
        (bytes, Manifest { index: 12, term: 3, sealed: false, segments, members })
    }

    /// A follower with an old segment 0 and a hard-state file of `0xaa`.
    fn follower() -> (tempfile::TempDir, DiskWal) {
        let tmp = tempfile::tempdir().unwrap();
        let wal = DiskWal::open(tmp.path()).unwrap();
        wal.create(SegmentId(0), b"old", 4096).unwrap();
        std::fs::write(tmp.path().join(HARD_STATE_FILE), vec![0xaa; FILE_BYTES]).unwrap();
        (tmp, wal)
    }

    fn send(staging: &Staging, leader: &[u8], chunk: usize) {
        for (segment, have, bytes) in staging.missing().unwrap() {
            let mut at = have;
            while at < bytes {
                let n = chunk.min((bytes - at) as usize);
                staging.write(segment, at, &leader[at as usize..at as usize + n]).unwrap();
                at += n as u64;
            }
        }
    }

    #[test]
    fn an_install_resumes_its_staging_and_swaps_in_the_wal_and_hard_state() {
        let (leader, manifest) = leader_segment();
        let (tmp, wal) = follower();
        let staging = wal.stage(&manifest).unwrap();
        let end = manifest.segments[0].bytes;
        staging.write(SegmentId(3), 0, &leader[..100]).unwrap();
        staging.write(SegmentId(3), 0, &leader[..100]).unwrap();
        assert!(staging.write(SegmentId(3), 150, &leader[150..160]).is_err(), "no hole");
        assert!(staging.write(SegmentId(3), 100, &leader[100..end as usize + 1]).is_err(), "not past the bytes");
        assert!(staging.write(SegmentId(4), 0, b"x").is_err(), "not another segment");
        drop(staging);
        // A reconnect (or a restart) resumes where the staged bytes end.
        let staging = wal.stage(&manifest).unwrap();
        assert_eq!(staging.missing().unwrap(), vec![(SegmentId(3), 100, end)]);
        assert!(wal.install(wal.stage(&manifest).unwrap(), &(0, vec![1; 10])).is_err(), "not staged in full");
        send(&staging, &leader, 7);
        assert!(staging.missing().unwrap().is_empty());
        wal.install(staging, &(SLOT_BYTES as u64, vec![0x55; 64])).unwrap();
        let (ids, strays) = wal.list().unwrap();
        assert_eq!((ids, strays), (vec![SegmentId(3)], vec![]), "the old segment is gone");
        let installed = wal.read(SegmentId(3)).unwrap();
        assert_eq!(installed.len(), 8192);
        assert_eq!(&installed[..end as usize], &leader[..end as usize]);
        assert!(installed[end as usize..].iter().all(|b| *b == 0), "nothing past the snapshot");
        let state = std::fs::read(tmp.path().join(HARD_STATE_FILE)).unwrap();
        assert_eq!(&state[..SLOT_BYTES], &[0xaa; SLOT_BYTES][..], "the other slot kept");
        assert_eq!(&state[SLOT_BYTES..SLOT_BYTES + 64], &[0x55; 64][..]);
        assert!(!tmp.path().join(INSTALL_DIR).exists() && !tmp.path().join(READY_DIR).exists());
        // Appends continue in the installed segment.
        wal.append(SegmentId(3), end, b"next").unwrap();
    }

    #[test]
    fn a_staging_that_does_not_check_is_discarded_and_the_old_wal_kept() {
        let (mut leader, manifest) = leader_segment();
        leader[40] ^= 1;
        let (tmp, wal) = follower();
        let staging = wal.stage(&manifest).unwrap();
        send(&staging, &leader, 1000);
        match wal.install(staging, &(0, vec![0x55; 64])) {
            Err(InstallError::Check(_)) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(wal.list().unwrap().0, vec![SegmentId(0)]);
        assert_eq!(std::fs::read(tmp.path().join(HARD_STATE_FILE)).unwrap(), vec![0xaa; FILE_BYTES]);
        assert!(!tmp.path().join(INSTALL_DIR).exists(), "a damaged staging is not resumed");
        // Another manifest's staging is not resumed either.
        let (leader, manifest) = leader_segment();
        let staging = wal.stage(&manifest).unwrap();
        send(&staging, &leader, 1000);
        let mut other = manifest.clone();
        other.index = 13;
        assert_eq!(wal.stage(&other).unwrap().missing().unwrap()[0].1, 0);
    }

    /// A crash after the commit at each step of the swap: the next start
    /// finishes it, whichever step it reached, also where a cut left a
    /// moved file under both names.
    #[test]
    fn a_swap_a_crash_interrupted_is_finished_at_the_next_start() {
        for step in 0..6 {
            let (leader, manifest) = leader_segment();
            let (tmp, wal) = follower();
            let staging = wal.stage(&manifest).unwrap();
            send(&staging, &leader, 1000);
            // What `install` does up to the commit, then `step` steps of the swap.
            let ready = tmp.path().join(READY_DIR);
            for s in &manifest.segments {
                let f = OpenOptions::new().write(true).open(staging.path(s.id)).unwrap();
                write_zeros(&f, s.bytes, s.size).unwrap();
            }
            std::fs::write(staging.dir.join(HARD_STATE_FILE), vec![0x55; FILE_BYTES]).unwrap();
            std::fs::rename(&staging.dir, &ready).unwrap();
            let segment = format!("{:020}.seg", 3);
            let (staged, placed) = (ready.join(WAL_DIR).join(&segment), wal.dir().join(&segment));
            if step >= 1 {
                std::fs::rename(wal.dir(), tmp.path().join(SET_ASIDE_WAL)).unwrap();
            }
            if step >= 2 {
                std::fs::create_dir(wal.dir()).unwrap();
            }
            if step == 3 {
                std::fs::hard_link(&staged, &placed).unwrap();
            }
            if step >= 4 {
                std::fs::rename(&staged, &placed).unwrap();
                std::fs::remove_dir(ready.join(WAL_DIR)).unwrap();
            }
            if step >= 5 {
                let state = tmp.path().join(HARD_STATE_FILE);
                std::fs::remove_file(&state).unwrap();
                std::fs::hard_link(ready.join(HARD_STATE_FILE), &state).unwrap();
            }
            drop(wal);
            // Opening the WAL finishes it.
            let wal = DiskWal::open(tmp.path()).unwrap();
            assert_eq!(wal.list().unwrap(), (vec![SegmentId(3)], vec![]), "step {step}");
            assert_eq!(&wal.read(SegmentId(3)).unwrap()[..100], &leader[..100]);
            assert_eq!(std::fs::read(tmp.path().join(HARD_STATE_FILE)).unwrap(), vec![0x55; FILE_BYTES]);
            assert!(!ready.exists() && !tmp.path().join(SET_ASIDE_WAL).exists());
            assert!(!wal.finish_install().unwrap(), "nothing more to do");
        }
    }
}
