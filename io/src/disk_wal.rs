//! The WAL on local disk, under `DATA_DIR/wal/`.
//!
//! Each segment is a file named by its zero-padded id (`00000000000000000007.seg`),
//! zero-filled to its full size when created, with its header written and
//! both file and directory fsynced before the engine may use it: creation is
//! off the commit path. A commit group is then one positioned write that
//! returns once the bytes are durable: `pwritev2` with `RWF_DSYNC`, the write
//! and its `fdatasync` in one call (`append_syncs` counts them), or a write
//! and an `fdatasync` where the kernel or file system refuses the flag.
//! Files that are not segments are left alone and reported.

use bytes::Bytes;
use skippr_core::format::GroupPlace;
use skippr_core::{IoError, IoReply, SegmentId, WalListing, WalOp};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tracing::{info, warn};

mod install;
mod replicated;

pub use install::{InstallError, Staging, INSTALL_DIR};

pub const WAL_DIR: &str = "wal";
const SUFFIX: &str = ".seg";
/// The stop record a run that stopped on SIGTERM left (`DATA_DIR/...`).
pub const STOP_RECORD_FILE: &str = "stop-record";

pub struct DiskWal {
    data_dir: PathBuf,
    dir: PathBuf,
    /// The segment appends go to, and its size when opened.
    open: Mutex<Option<(SegmentId, File, u64)>>,
    /// Durable writes made for appends: exactly one per commit group.
    pub append_syncs: AtomicU64,
    /// The kernel refused `RWF_DSYNC` once: write, then `fdatasync`.
    no_dsync_flag: AtomicBool,
    /// Clustered mode: `DATA_DIR/raft-state`, opened at its first save.
    hard_state: Mutex<Option<File>>,
    /// The buffers recovery's windows are read into, lent to the engine
    /// and taken back, so that each is allocated and zeroed once.
    windows: Windows,
}

/// Aligned buffers for `O_DIRECT` reads, lent to the engine as they are
/// (a window is the part of one that holds the bytes asked for, no copy)
/// and taken back when it drops them: two at most (the one the engine
/// scans and the one the next read fills).
#[derive(Clone, Default)]
struct Windows(Arc<Mutex<Vec<Vec<u8>>>>);

impl Windows {
    const KEPT: usize = 2;

    fn take(&self) -> Vec<u8> {
        self.0.lock().expect("not poisoned").pop().unwrap_or_default()
    }

    /// `raw[at]`, lent out; `raw` comes back when the window is dropped.
    fn lend(&self, raw: Vec<u8>, at: std::ops::Range<usize>) -> Bytes {
        Bytes::from_owner(Lent { raw, at, home: self.clone() })
    }
}

struct Lent {
    raw: Vec<u8>,
    at: std::ops::Range<usize>,
    home: Windows,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.raw[self.at.clone()]
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let raw = std::mem::take(&mut self.raw);
        if raw.len() <= DiskWal::WINDOW_KEPT + 2 * ALIGN as usize {
            let mut kept = self.home.0.lock().expect("not poisoned");
            if kept.len() < Windows::KEPT {
                kept.push(raw);
            }
        }
    }
}

impl DiskWal {
    /// Opens (creating if needed) `data_dir/wal`, completing a snapshot's
    /// install a crash interrupted after its commit (clustered mode).
    pub fn open(data_dir: &Path) -> io::Result<DiskWal> {
        let wal = DiskWal {
            data_dir: data_dir.to_path_buf(),
            dir: data_dir.join(WAL_DIR),
            open: Mutex::new(None),
            append_syncs: AtomicU64::new(0),
            no_dsync_flag: AtomicBool::new(false),
            windows: Windows::default(),
            hard_state: Mutex::new(None),
        };
        // A snapshot's install that committed before a crash is completed
        // before anything reads the WAL.
        wal.finish_install()?;
        create_dir_durably(&wal.dir, 0o700)?;
        Ok(wal)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, segment: SegmentId) -> PathBuf {
        self.dir.join(format!("{:020}{SUFFIX}", segment.0))
    }

    /// Segment ids found, and the paths of files that are not segments.
    pub fn list(&self) -> io::Result<(Vec<SegmentId>, Vec<PathBuf>)> {
        list_dir(&self.dir)
    }

    /// fsyncs every segment and the directory: data a killed process left in
    /// the page cache becomes durable before recovery trusts it.
    pub fn sync_all(&self) -> io::Result<()> {
        let (ids, _) = self.list()?;
        for id in ids {
            File::open(self.path(id))?.sync_all()?;
        }
        sync_dir(&self.dir)
    }

    /// Reads a segment as the device holds it. After a failed `fdatasync`
    /// Linux keeps the unwritten pages in the page cache marked clean: a
    /// normal read would return a group that is not on disk, and recovery
    /// would admit it. `O_DIRECT` reads past the cache (file systems without
    /// it, like tmpfs, have no device to be wrong about).
    pub fn read(&self, segment: SegmentId) -> io::Result<Bytes> {
        self.read_at(segment, 0, usize::MAX)
    }

    /// Windows up to this size are read into buffers kept between reads;
    /// a larger read (a whole segment) gets its own.
    const WINDOW_KEPT: usize = 16 << 20;

    /// `len` bytes of a segment from `offset` as the device holds them
    /// (`read`'s reason), fewer at the file's end: recovery's windows.
    pub fn read_at(&self, segment: SegmentId, offset: u64, len: usize) -> io::Result<Bytes> {
        let path = self.path(segment);
        let file = match OpenOptions::new().read(true).custom_flags(nix::libc::O_DIRECT).open(&path) {
            Ok(file) => file,
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => File::open(&path)?,
            Err(e) => return Err(e),
        };
        let raw = if len > Self::WINDOW_KEPT { Vec::new() } else { self.windows.take() };
        let (raw, at) = read_direct(&file, offset, len, raw)?;
        Ok(self.windows.lend(raw, at))
    }

    /// Performs one WAL request of the engine's.
    pub fn perform(&self, op: WalOp) -> Result<IoReply, IoError> {
        let failed = |what: &str, e: io::Error| {
            warn!(error = %e, "{what} failed");
            to_io_error(&e)
        };
        match op {
            WalOp::Replicate(r) => {
                self.replicate(&r).map(|_| IoReply::Done).map_err(|e| failed("writing raft entries to the WAL", e))
            }
            WalOp::ReadHardState => self
                .read_hard_state()
                .map(IoReply::HardState)
                .map_err(|e| failed("reading the raft hard-state file", e)),
            WalOp::InstallSnapshot(_) => {
                unreachable!("the driver installs snapshots: their segments come from a peer (`Staging`)")
            }
            WalOp::ReadStopRecord => {
                self.read_stop_record().map(IoReply::StopRecord).map_err(|e| failed("reading the stop record", e))
            }
            WalOp::WriteStopRecord(bytes) => {
                self.write_stop_record(&bytes).map(|_| IoReply::Done).map_err(|e| failed("writing the stop record", e))
            }
            WalOp::Sync => self.sync_all().map(|_| IoReply::Done).map_err(|e| failed("syncing the WAL", e)),
            WalOp::List => {
                let (ids, strays) = self.list().map_err(|e| failed("listing the WAL", e))?;
                for path in strays {
                    warn!(path = %path.display(), "ignoring a file in the WAL directory that is not a segment");
                }
                let sized = ids
                    .into_iter()
                    .map(|id| Ok((id, std::fs::metadata(self.path(id))?.len())))
                    .collect::<io::Result<_>>()
                    .map_err(|e| failed("listing the WAL", e))?;
                Ok(IoReply::Segments(WalListing::Files(sized)))
            }
            WalOp::ReadAt { segment, offset, len } => self
                .read_at(segment, offset, len)
                .map(IoReply::SegmentBytes)
                .map_err(|e| failed("reading a WAL segment", e)),
            WalOp::ReadGroups { places } => places
                .into_iter()
                .map(|place| self.read_group(place))
                .collect::<io::Result<Vec<_>>>()
                .map(IoReply::Groups)
                .map_err(|e| failed("reading committed groups back from the WAL", e)),
            WalOp::Create { segment, header, size } => self
                .create(segment, &header, size)
                .map(|_| IoReply::Done)
                .map_err(|e| failed("creating a WAL segment", e)),
            WalOp::Append { segment, offset, bytes, .. } => self
                .append(segment, offset, &bytes)
                .map(|_| IoReply::Done)
                .map_err(|e| failed("appending to the WAL", e)),
            WalOp::Delete { segment } => {
                self.delete(segment).map(|_| IoReply::Done).map_err(|e| failed("deleting a WAL segment", e))
            }
        }
    }

    /// `DATA_DIR/stop-record`, if there is one.
    pub fn read_stop_record(&self) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.data_dir.join(STOP_RECORD_FILE)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replaces `DATA_DIR/stop-record`: written beside it (owner-only),
    /// synced, renamed over it, the directory synced.
    pub fn write_stop_record(&self, bytes: &[u8]) -> io::Result<()> {
        let path = self.data_dir.join(STOP_RECORD_FILE);
        let tmp = self.data_dir.join(format!("{STOP_RECORD_FILE}.new"));
        let mut f = OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
        io::Write::write_all(&mut f, bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        sync_dir(&self.data_dir)?;
        info!(bytes = bytes.len(), path = %path.display(), "wrote the stop record: the next start need not scan the WAL");
        Ok(())
    }

    /// Exactly the bytes of one committed group, through the page cache.
    pub fn read_group(&self, place: GroupPlace) -> io::Result<Vec<u8>> {
        let file = File::open(self.path(place.segment))?;
        let mut bytes = vec![0; place.len as usize];
        file.read_exact_at(&mut bytes, place.offset)?;
        Ok(bytes)
    }

    /// Creates the segment: zero-filled to `size` (so appends never grow
    /// the file and `fdatasync` has no size to update), header at offset 0,
    /// file and directory fsynced. An existing file of that name is replaced.
    pub fn create(&self, segment: SegmentId, header: &[u8], size: u64) -> io::Result<()> {
        let path = self.path(segment);
        let mut open = self.open.lock().expect("not poisoned");
        if open.as_ref().is_some_and(|(id, ..)| *id == segment) {
            // Its size may change: the next append opens it again.
            *open = None;
        }
        drop(open);
        let file = OpenOptions::new().create(true).write(true).truncate(true).mode(0o600).open(&path)?;
        let chunk = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < size {
            let n = chunk.len().min((size - at) as usize);
            file.write_all_at(&chunk[..n], at)?;
            at += n as u64;
        }
        file.write_all_at(header, 0)?;
        file.sync_all()?;
        if crate::planted::armed(crate::planted::DriverFault::SkipSegmentDirSync) {
            return Ok(());
        }
        sync_dir(&self.dir)
    }

    /// The segment appends go to, opened if it is another, checked to
    /// hold `len` bytes at `offset`.
    fn open_for(
        &self,
        segment: SegmentId,
        offset: u64,
        len: usize,
    ) -> io::Result<std::sync::MutexGuard<'_, Option<(SegmentId, File, u64)>>> {
        let mut open = self.open.lock().expect("not poisoned");
        if open.as_ref().is_none_or(|(id, ..)| *id != segment) {
            let file = OpenOptions::new().write(true).open(self.path(segment))?;
            // The file's own size, not today's setting: it may have been
            // created under another WAL_BYTES_PER_FILE. Appends never grow it.
            let size = file.metadata()?.len();
            *open = Some((segment, file, size));
        }
        let (_, _, size) = open.as_ref().expect("set above");
        if offset + len as u64 > *size {
            return Err(io::Error::other(format!("append past the end of segment {}", segment.0)));
        }
        Ok(open)
    }

    /// A positioned write, not yet durable (`sync_segment` makes it so).
    fn write_at(&self, segment: SegmentId, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let open = self.open_for(segment, offset, bytes.len())?;
        open.as_ref().expect("opened").1.write_all_at(bytes, offset)
    }

    /// `fdatasync` of one segment.
    fn sync_segment(&self, segment: SegmentId) -> io::Result<()> {
        let open = self.open_for(segment, 0, 0)?;
        open.as_ref().expect("opened").1.sync_data()
    }

    /// One commit group: one positioned write that returns once the bytes
    /// are durable.
    pub fn append(&self, segment: SegmentId, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let open = self.open_for(segment, offset, bytes.len())?;
        let (_, file, _) = open.as_ref().expect("opened");
        if crate::planted::armed(crate::planted::DriverFault::AckBeforeDurable) {
            return file.write_all_at(bytes, offset);
        }
        self.append_syncs.fetch_add(1, Ordering::Relaxed);
        if !self.no_dsync_flag.load(Ordering::Relaxed) {
            match write_all_dsync(file, bytes, offset) {
                Err(e) if dsync_flag_refused(&e) => {
                    warn!(error = %e, "the kernel refuses RWF_DSYNC writes here; appends use a write and fdatasync");
                    self.no_dsync_flag.store(true, Ordering::Relaxed);
                }
                result => return result,
            }
        }
        file.write_all_at(bytes, offset)?;
        file.sync_data()
    }

    pub fn delete(&self, segment: SegmentId) -> io::Result<()> {
        let mut open = self.open.lock().expect("not poisoned");
        if open.as_ref().is_some_and(|(id, ..)| *id == segment) {
            *open = None;
        }
        match std::fs::remove_file(self.path(segment)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        sync_dir(&self.dir)
    }
}

/// Writes all of `bytes` at `offset`, each piece durable before the call
/// that wrote it returns (`pwritev2` with `RWF_DSYNC`).
fn write_all_dsync(file: &File, mut bytes: &[u8], mut offset: u64) -> io::Result<()> {
    use nix::libc;
    while !bytes.is_empty() {
        let iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
        let at = libc::off_t::try_from(offset).map_err(|_| io::Error::other("offset beyond off_t"))?;
        // SAFETY: one iovec over `bytes`, which outlives the call and is
        // only read; the descriptor is open for writing.
        let n = unsafe { libc::pwritev2(file.as_raw_fd(), &iov, 1, at, libc::RWF_DSYNC) };
        match n {
            n if n > 0 => {
                bytes = &bytes[n as usize..];
                offset += n as u64;
            }
            0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// The kernel (before 4.7) or the file system does not take the flag: no
/// byte was written, and a plain write with `fdatasync` does the same job.
fn dsync_flag_refused(e: &io::Error) -> bool {
    use nix::libc;
    matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL))
}

/// Reads a whole file opened with `O_DIRECT`: offsets, lengths and the
/// buffer aligned to 4 KiB.
/// `len` bytes from `offset` (fewer at the end), read in whole aligned
/// blocks into an aligned part of `raw` (grown as needed), as `O_DIRECT`
/// requires (a file opened without it reads the same way).
fn read_direct(
    file: &File,
    offset: u64,
    len: usize,
    mut raw: Vec<u8>,
) -> io::Result<(Vec<u8>, std::ops::Range<usize>)> {
    let size = file.metadata()?.len();
    let end = offset.saturating_add(len as u64).min(size);
    if end <= offset {
        return Ok((raw, 0..0));
    }
    let first = offset / ALIGN * ALIGN;
    let padded = (end.div_ceil(ALIGN) * ALIGN - first) as usize;
    if raw.len() < padded + ALIGN as usize {
        raw = vec![0u8; padded + ALIGN as usize];
    }
    let start = raw.as_ptr().align_offset(ALIGN as usize);
    let buf = &mut raw[start..start + padded];
    let want = (end - first) as usize;
    let mut at = 0;
    while at < want {
        let n = file.read_at(&mut buf[at..], first + at as u64)?;
        if n == 0 {
            break;
        }
        at += n;
    }
    let skip = (offset - first) as usize;
    Ok((raw, start + skip.min(at)..start + at.min(want)))
}

/// `O_DIRECT` reads and their buffers are aligned to this.
const ALIGN: u64 = 4096;

/// The file under DATA_DIR that names a disk WAL in stores it shares with
/// others (a sink's keys, DynamoDB offsets).
pub const IDENTITY_FILE: &str = "wal-identity";

/// The disk WAL's identity, made once and kept in `DATA_DIR/wal-identity`,
/// so that a WAL moved to another directory or host (a backup restored,
/// a container whose host name changed) is still itself to the
/// destinations that key by it. A WAL that already holds segments when the
/// file is first made (one of before the file) keeps the name it had then,
/// `disk://<host><dir>/`, so what it wrote elsewhere stays its own; a new
/// one gets that name with a random suffix, so two hosts of one name and
/// path are never taken for one WAL. Call it under the DATA_DIR lock.
pub fn wal_identity(data_dir: &Path, random: u64) -> io::Result<String> {
    if let Some(identity) = read_wal_identity(data_dir)? {
        return Ok(identity);
    }
    let wal_dir = data_dir.join(WAL_DIR);
    let old = wal_dir.exists() && !list_dir(&wal_dir)?.0.is_empty();
    let named = derived_identity(&wal_dir);
    let identity = if old { named } else { format!("{named}#{random:016x}") };
    let path = data_dir.join(IDENTITY_FILE);
    let tmp = data_dir.join(format!("{IDENTITY_FILE}.new"));
    let mut f = OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
    io::Write::write_all(&mut f, format!("{identity}\n").as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, &path)?;
    sync_dir(data_dir)?;
    Ok(identity)
}

/// The identity `wal_identity` made, if it has: for tools that must not
/// write (the WAL's name where none was made yet, as a start would name an
/// old WAL).
pub fn read_wal_identity(data_dir: &Path) -> io::Result<Option<String>> {
    match std::fs::read_to_string(data_dir.join(IDENTITY_FILE)) {
        Ok(s) if !s.trim().is_empty() => Ok(Some(s.trim().to_string())),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// `disk://<host><absolute WAL directory>/`: what named a disk WAL before
/// the identity file.
pub fn derived_identity(wal_dir: &Path) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let dir = std::path::absolute(wal_dir).unwrap_or_else(|_| wal_dir.to_path_buf());
    format!("disk://{}{}/", host.trim(), dir.display())
}

/// Segment ids in `dir`, and the other files found there.
pub fn list_dir(dir: &Path) -> io::Result<(Vec<SegmentId>, Vec<PathBuf>)> {
    let mut ids = Vec::new();
    let mut strays = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let id = name
            .to_str()
            .and_then(|n| n.strip_suffix(SUFFIX))
            .filter(|n| n.len() == 20 && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse().ok());
        match id {
            Some(id) if entry.file_type()?.is_file() => ids.push(SegmentId(id)),
            _ => strays.push(entry.path()),
        }
    }
    ids.sort();
    strays.sort();
    Ok((ids, strays))
}

pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and whatever of its ancestors is missing, each with `mode`,
/// and makes each new entry durable: the directory that holds it is synced
/// after it is made, so a power cut cannot take a directory whose contents
/// were synced (a new DATA_DIR with its WAL, a sink's stream directory).
pub fn create_dir_durably(dir: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.exists() {
        missing.push(at);
        match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => at = parent,
            _ => break,
        }
    }
    for new in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(mode).create(new) {
            Ok(()) => {}
            // Made meanwhile by another thread or process: it syncs it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
        let parent = match new.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        sync_dir(parent)?;
    }
    Ok(())
}

/// How an I/O error reaches the engine.
pub fn to_io_error(e: &io::Error) -> IoError {
    if e.raw_os_error() == Some(nix::libc::ENOSPC) || e.kind() == io::ErrorKind::StorageFull {
        IoError::NoSpace
    } else {
        IoError::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wal_keeps_its_identity_when_moved_and_an_old_one_keeps_its_name() {
        let tmp = tempfile::tempdir().unwrap();
        let new = tmp.path().join("new");
        std::fs::create_dir_all(new.join(WAL_DIR)).unwrap();
        let made = wal_identity(&new, 0xabc).unwrap();
        assert_eq!(made, format!("{}#0000000000000abc", derived_identity(&new.join(WAL_DIR))));
        assert_eq!(wal_identity(&new, 0xdef).unwrap(), made, "made once");
        let moved = tmp.path().join("moved");
        std::fs::rename(&new, &moved).unwrap();
        assert_eq!(wal_identity(&moved, 0xdef).unwrap(), made, "moved, still itself");
        assert_eq!(read_wal_identity(&moved).unwrap(), Some(made));
        // A WAL of before the file: the name it had.
        let old = tmp.path().join("old");
        std::fs::create_dir_all(old.join(WAL_DIR)).unwrap();
        std::fs::write(old.join(WAL_DIR).join("00000000000000000000.seg"), b"").unwrap();
        assert_eq!(read_wal_identity(&old).unwrap(), None);
        assert_eq!(wal_identity(&old, 1).unwrap(), derived_identity(&old.join(WAL_DIR)));
    }

    #[test]
    fn create_append_read_list_delete() {
        let tmp = tempfile::tempdir().unwrap();
        let wal = DiskWal::open(tmp.path()).unwrap();
        wal.create(SegmentId(3), b"header", 8192).unwrap();
        std::fs::write(wal.dir().join("notes.txt"), b"stray").unwrap();
        wal.append(SegmentId(3), 6, b"group").unwrap();
        wal.append(SegmentId(3), 11, b"next").unwrap();
        assert_eq!(wal.append_syncs.load(Ordering::Relaxed), 2, "one durable write per group");
        let bytes = wal.read(SegmentId(3)).unwrap();
        assert_eq!(bytes.len(), 8192, "preallocated to full size");
        assert_eq!(&bytes[..15], b"headergroupnext");
        let (ids, strays) = wal.list().unwrap();
        assert_eq!(ids, vec![SegmentId(3)]);
        assert_eq!(strays, vec![wal.dir().join("notes.txt")]);
        assert!(wal.append(SegmentId(3), 8190, b"xyz").is_err(), "never past the end");
        wal.sync_all().unwrap();
        wal.delete(SegmentId(3)).unwrap();
        assert!(wal.list().unwrap().0.is_empty());
    }

    /// Recovery's windows start and end anywhere: each is the file's bytes
    /// there, short at its end and empty past it, though the device is read
    /// in aligned blocks.
    #[test]
    fn windows_read_the_bytes_at_any_offset_and_stop_at_the_end() {
        let tmp = tempfile::tempdir().unwrap();
        let wal = DiskWal::open(tmp.path()).unwrap();
        let size = 3 * 4096 + 100;
        wal.create(SegmentId(1), b"head", size).unwrap();
        let body: Vec<u8> = (0..size as usize - 4).map(|i| (i * 7 % 251) as u8).collect();
        wal.append(SegmentId(1), 4, &body).unwrap();
        let whole = wal.read(SegmentId(1)).unwrap();
        assert_eq!(whole.len(), size as usize);
        for (offset, len) in [(0, 10), (1, 4096), (4095, 2), (4096, 4096), (5000, 9000), (12000, 1000), (12388, 5)] {
            let end = (offset + len).min(size as usize);
            let got = wal.read_at(SegmentId(1), offset as u64, len).unwrap();
            assert_eq!(got, &whole[offset..end], "{len} bytes at {offset}");
        }
        assert!(wal.read_at(SegmentId(1), size, 10).unwrap().is_empty(), "nothing past the end");
        assert!(wal.read_at(SegmentId(9), 0, 10).is_err(), "no such segment");
    }

    #[test]
    fn appends_fall_back_to_write_and_fdatasync_where_the_flag_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let wal = DiskWal::open(tmp.path()).unwrap();
        wal.no_dsync_flag.store(true, Ordering::Relaxed);
        wal.create(SegmentId(1), b"head", 4096).unwrap();
        wal.append(SegmentId(1), 4, b"one").unwrap();
        wal.append(SegmentId(1), 7, b"two").unwrap();
        assert_eq!(&wal.read(SegmentId(1)).unwrap()[..10], b"headonetwo");
        assert_eq!(wal.append_syncs.load(Ordering::Relaxed), 2);
        for errno in [nix::libc::ENOSYS, nix::libc::EOPNOTSUPP, nix::libc::EINVAL] {
            assert!(dsync_flag_refused(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
        assert!(!dsync_flag_refused(&io::Error::from_raw_os_error(nix::libc::EIO)), "a write error is an error");
    }

    #[test]
    fn a_segment_created_again_is_appended_to_at_its_new_size() {
        let tmp = tempfile::tempdir().unwrap();
        let wal = DiskWal::open(tmp.path()).unwrap();
        wal.create(SegmentId(2), b"h", 4096).unwrap();
        wal.append(SegmentId(2), 1, b"a").unwrap();
        wal.create(SegmentId(2), b"h", 8192).unwrap();
        wal.append(SegmentId(2), 6000, b"b").unwrap();
        assert_eq!(wal.read(SegmentId(2)).unwrap()[6000], b'b');
    }
}
