//! The model mounted with FUSE (fuser, no libfuse), for real processes to
//! use. Writes reach it at once: the mount asks for no writeback cache, so
//! each `write` is a request, and the kernel turns an `O_DSYNC` or
//! `RWF_DSYNC` write into the write and an `fsync` of the file. A cut
//! unmounts (dropping whatever the kernel cached of the files), cuts the
//! model, and mounts it again at the same place. The processes using the
//! mount are to be killed first.

use super::{Kind, Model, Rules, ROOT};
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, MountOption,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nothing is cached by the kernel beyond a request: sizes and entries
/// change under it at a cut.
const TTL: Duration = Duration::ZERO;

/// What the mount saw, for tests to count.
#[derive(Debug, Default)]
pub struct Seen {
    pub writes: AtomicU64,
    pub file_syncs: AtomicU64,
    pub dir_syncs: AtomicU64,
    /// Unmounts refused as busy (and asked again) at cuts.
    pub busy_unmounts: AtomicU64,
}

struct ForgetFs {
    model: Arc<Mutex<Model>>,
    seen: Arc<Seen>,
    uid: u32,
    gid: u32,
}

fn errno(e: nix::errno::Errno) -> Errno {
    Errno::from_i32(e as i32)
}

fn name(n: &OsStr) -> Result<&str, Errno> {
    n.to_str().ok_or(Errno::EINVAL)
}

impl ForgetFs {
    fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn attr(&self, m: &Model, ino: u64) -> Result<FileAttr, Errno> {
        let kind = m.kind(ino).ok_or(Errno::ENOENT)?;
        let size = m.size(ino).map_err(errno)?;
        let (kind, perm) = match kind {
            Kind::File => (FileType::RegularFile, 0o600),
            Kind::Dir => (FileType::Directory, 0o700),
        };
        let t: SystemTime = UNIX_EPOCH;
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm,
            nlink: m.links(ino),
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn entry(&self, reply: ReplyEntry, made: impl FnOnce(&mut Model) -> Result<u64, nix::errno::Errno>) {
        let mut m = self.model();
        match made(&mut m).map_err(errno).and_then(|ino| self.attr(&m, ino)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn empty(&self, reply: ReplyEmpty, done: impl FnOnce(&mut Model) -> Result<(), nix::errno::Errno>) {
        match done(&mut self.model()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl Filesystem for ForgetFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        match name(n) {
            Ok(n) => self.entry(reply, |m| m.lookup(parent.0, n)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        self.model().forget(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let m = self.model();
        match self.attr(&m, ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut m = self.model();
        if let Some(size) = size {
            if let Err(e) = m.truncate(ino.0, size) {
                return reply.error(errno(e));
            }
        }
        match self.attr(&m, ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, n: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        match name(n) {
            Ok(n) => self.entry(reply, |m| m.create(parent.0, n, Kind::Dir)),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        n: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let mut m = self.model();
        match m.create(parent.0, n, Kind::File).map_err(errno).and_then(|ino| self.attr(&m, ino)) {
            Ok(attr) => reply.created(&TTL, &attr, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        match name(n) {
            Ok(n) => self.empty(reply, |m| m.unlink(parent.0, n, false)),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        match name(n) {
            Ok(n) => self.empty(reply, |m| m.unlink(parent.0, n, true)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (n, to) = match (name(n), name(newname)) {
            (Ok(n), Ok(to)) => (n, to),
            _ => return reply.error(Errno::EINVAL),
        };
        if flags.contains(RenameFlags::RENAME_EXCHANGE) || flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        self.empty(reply, |m| {
            if no_replace && m.lookup(newparent.0, to).is_ok() {
                return Err(nix::errno::Errno::EEXIST);
            }
            m.rename(parent.0, n, newparent.0, to)
        })
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        match name(newname) {
            Ok(to) => self.entry(reply, |m| m.link(ino.0, newparent.0, to).map(|_| ino.0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.model().kind(ino.0) {
            Some(Kind::File) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Some(Kind::Dir) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.model().read(ino.0, offset, size as usize) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.seen.writes.fetch_add(1, Ordering::Relaxed);
        let dsync = flags.0 & (nix::libc::O_DSYNC | nix::libc::O_SYNC) != 0;
        match self.model().write(ino.0, offset, data, dsync) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // A close makes nothing durable.
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.seen.file_syncs.fetch_add(1, Ordering::Relaxed);
        self.empty(reply, |m| m.sync(ino.0));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.model().kind(ino.0) {
            Some(Kind::Dir) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Some(Kind::File) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let m = self.model();
        let entries = match m.entries(ino.0) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(e)),
        };
        let dots = [(ino.0, FileType::Directory, ".".to_string()), (ino.0, FileType::Directory, "..".to_string())];
        let all = dots.into_iter().chain(entries.into_iter().map(|(n, i)| {
            let kind = if m.kind(i) == Some(Kind::Dir) { FileType::Directory } else { FileType::RegularFile };
            (i, kind, n)
        }));
        for (at, (i, kind, n)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(i), at as u64 + 1, kind, n) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.seen.dir_syncs.fetch_add(1, Ordering::Relaxed);
        self.empty(reply, |m| m.sync(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Room enough for any test: 64 GiB in 4 KiB blocks.
        reply.statfs(16 << 20, 16 << 20, 16 << 20, 1 << 20, 1 << 20, 4096, 255, 4096);
    }
}

/// The model mounted at a directory; unmounted when dropped.
pub struct Mount {
    dir: PathBuf,
    model: Arc<Mutex<Model>>,
    pub seen: Arc<Seen>,
    session: Option<fuser::BackgroundSession>,
}

impl Mount {
    /// An empty file system with the POSIX rules, mounted at `dir` (which
    /// must exist and be empty).
    pub fn new(dir: &Path) -> std::io::Result<Mount> {
        Mount::with_rules(dir, Rules::POSIX)
    }

    pub fn with_rules(dir: &Path, rules: Rules) -> std::io::Result<Mount> {
        Mount::with_model(dir, Model::new(rules))
    }

    /// `model` mounted at `dir`: a crash state, say, for recovery to run
    /// on with the model's own semantics (a file or directory a cut left
    /// under two names stays one).
    pub fn with_model(dir: &Path, model: Model) -> std::io::Result<Mount> {
        let mut mount =
            Mount { dir: dir.to_path_buf(), model: Arc::new(Mutex::new(model)), seen: Arc::default(), session: None };
        mount.mount()?;
        Ok(mount)
    }

    fn mount(&mut self) -> std::io::Result<()> {
        let fs = ForgetFs {
            model: Arc::clone(&self.model),
            seen: Arc::clone(&self.seen),
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        };
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("forgetfs".into()), MountOption::Subtype("forgetfs".into())];
        self.session = Some(fuser::spawn_mount2(fs, &self.dir, &config)?);
        Ok(())
    }

    /// Records every change from now on; returns the file system as it is
    /// now, which the trace replays onto (`Model::record`).
    pub fn record(&self) -> super::Model {
        self.model.lock().unwrap_or_else(|p| p.into_inner()).record()
    }

    /// The changes recorded since `record` (see `crash_states`).
    pub fn take_trace(&self) -> Vec<super::Op> {
        self.model.lock().unwrap_or_else(|p| p.into_inner()).take_trace()
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Cuts the power: unmounts, drops what was not durable, mounts again.
    /// Whatever used the mount must have been killed.
    pub fn cut(&mut self) -> std::io::Result<super::Cut> {
        end(&mut self.session, &self.dir, &self.seen)?;
        let cut = self.model.lock().unwrap_or_else(|p| p.into_inner()).cut();
        self.mount()?;
        Ok(cut)
    }

    /// Whether this machine can mount it (FUSE's device, and the right to
    /// mount): the suite's FUSE tests fail, never skip, without it.
    pub fn available() -> Result<(), String> {
        if !Path::new("/dev/fuse").exists() {
            return Err("no /dev/fuse: load the fuse module (modprobe fuse) or give the container the device".into());
        }
        if !nix::unistd::geteuid().is_root() {
            return Err("mounting needs root here (the suite runs as root in CI)".into());
        }
        Ok(())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = end(&mut self.session, &self.dir, &self.seen) {
            // The mount stays behind, dead (`tests/scripts/fuse.sh` takes
            // such mounts down at the suite's next start).
            eprintln!("forgetfs: unmounting {} failed: {e}", self.dir.display());
        }
    }
}

/// Times a busy mount is asked again to unmount, 50 ms apart.
const UNMOUNT_TRIES: u32 = 100;

/// Unmounts `dir` and waits for `session` (if any) to end. A mount still busy is
/// asked again: a host SIGKILLed and reaped has let go of its files, but a
/// process it was forking at the kill (a plugin's watchdog before it closes
/// what it inherited, a plugin before its exec) may hold copies of them
/// for a moment longer. Seen once in CI (`EBUSY` at a cut). Past the tries,
/// the error names the processes that hold the mount, which stays mounted
/// with its session (a later cut or the drop tries again).
fn end(session: &mut Option<fuser::BackgroundSession>, dir: &Path, seen: &Seen) -> std::io::Result<()> {
    use nix::errno::Errno;
    if session.is_none() {
        return Ok(());
    }
    let mut tries = 0;
    loop {
        match nix::mount::umount2(dir, nix::mount::MntFlags::empty()) {
            Ok(()) => break,
            Err(Errno::EBUSY) if tries < UNMOUNT_TRIES => {
                tries += 1;
                seen.busy_unmounts.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(Errno::EBUSY) => {
                return Err(std::io::Error::other(format!(
                    "{} is still busy after {tries} tries to unmount it, held by: {}",
                    dir.display(),
                    holders(dir)
                )))
            }
            Err(e) => return Err(e.into()),
        }
    }
    match session.take().expect("checked above").join() {
        Ok(()) => Ok(()),
        // The unmount went through, and the kernel aborted the FUSE
        // connection under the session's last read (fuser ends quietly
        // only on ENODEV): the session is over all the same. Seen once in
        // a fresh clone's suite.
        Err(e) if e.raw_os_error() == Some(Errno::ECONNABORTED as i32) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The processes with a file, or their working directory, under `dir`:
/// pid and command line of each, for an unmount that stays busy.
fn holders(dir: &Path) -> String {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let proc = entry.path();
        let mut links: Vec<PathBuf> =
            std::fs::read_dir(proc.join("fd")).into_iter().flatten().flatten().map(|f| f.path()).collect();
        links.push(proc.join("cwd"));
        if links.iter().any(|l| std::fs::read_link(l).is_ok_and(|t| t.starts_with(dir))) {
            let cmdline = std::fs::read(proc.join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push(format!("{pid} ({})", cmdline.trim()));
        }
    }
    if found.is_empty() {
        "no process this one can see".into()
    } else {
        found.join(", ")
    }
}

// The root is the model's root.
const _: () = assert!(ROOT == INodeNo::ROOT.0);
