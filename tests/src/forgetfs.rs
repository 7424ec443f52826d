//! A file system that forgets what was not made durable (issue #29): the
//! model the power-cut tests mount. Every file holds the bytes a reader
//! sees (`current`) and the bytes a power cut leaves (`durable`); every
//! directory holds its entries as seen and as durable. A power cut sets
//! each to its durable state.
//!
//! The rules are the POSIX minimum, which is what skipprd may rely on:
//!
//! 1. **Data.** A write, a truncation or an extension is durable once the
//!    file is synced (`fsync`, `fdatasync`); a write made with `O_DSYNC` or
//!    `RWF_DSYNC` is durable at once, that write alone (other unsynced
//!    writes to the file stay unsynced; a gap it leaves past the durable
//!    end reads as zeros after a cut).
//! 2. **Entries.** A directory's entries change (create, link, unlink, the
//!    two sides of a rename, each in its own directory) durably once that
//!    directory is synced. Syncing a file does not make its name durable.
//! 3. **The cut.** Every file and directory returns to its durable state;
//!    a file or directory that no durable entry reaches is gone, whatever
//!    its data.
//!
//! Where ext4 and XFS promise more, and skipprd must not count on it:
//! ext4's journal commits a new file's directory entry with the `fsync` of
//! the file in practice (`data=ordered`), and a rename over an existing
//! file flushes the new file's data first (`auto_da_alloc`); a rename is
//! atomic across two directories in both, where here each side is durable
//! with its own directory's sync (so a cut can leave both names, or
//! neither); XFS orders metadata in its log likewise. Sector writes are
//! taken as whole here (the disk's write cache honours flushes). A cut
//! keeps or drops each write whole; the crash states built from a trace
//! (`crash_states`) also tear writes at a sector boundary.

pub mod mount;

use nix::errno::Errno;
use std::collections::{BTreeMap, BTreeSet};

pub type Ino = u64;
/// The root directory's inode (FUSE's own number for it).
pub const ROOT: Ino = 1;

/// The rules, each of which a test can take out (to show that the test of
/// that rule fails without it). All on: the POSIX minimum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Rule 1: unsynced data is lost at a cut.
    pub data_needs_sync: bool,
    /// Rule 1: a `O_DSYNC` write is durable by itself.
    pub dsync_writes_are_durable: bool,
    /// Rule 2: unsynced entries are lost at a cut.
    pub entries_need_dir_sync: bool,
    /// Rule 3: what no durable entry reaches is gone at a cut.
    pub unreachable_is_gone: bool,
}

impl Rules {
    pub const POSIX: Rules = Rules {
        data_needs_sync: true,
        dsync_writes_are_durable: true,
        entries_need_dir_sync: true,
        unreachable_is_gone: true,
    };
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

#[derive(Clone, Debug, Default)]
struct File {
    current: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Clone, Debug, Default)]
struct Dir {
    current: BTreeMap<String, Ino>,
    durable: BTreeMap<String, Ino>,
}

#[derive(Clone, Debug)]
enum Node {
    File(File),
    Dir(Dir),
}

/// What one power cut did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    /// Files whose bytes changed (unsynced data dropped).
    pub files_reverted: u64,
    /// Directories whose entries changed.
    pub dirs_reverted: u64,
    /// Files and directories no durable entry reached any longer.
    pub nodes_gone: u64,
}

/// One change to the file system, as a trace records it (what a crash
/// state is built from: `Model::apply` replays it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Create { parent: Ino, name: String, kind: Kind },
    Write { ino: Ino, offset: u64, data: Vec<u8>, dsync: bool },
    Truncate { ino: Ino, size: u64 },
    Sync { ino: Ino },
    Unlink { parent: Ino, name: String, dir: bool },
    Link { ino: Ino, parent: Ino, name: String },
    Rename { parent: Ino, name: String, to_parent: Ino, to_name: String },
    Forget { ino: Ino },
}

impl Op {
    /// Whether the op is a durability call (an `fsync` of a file or a
    /// directory, or a write durable by itself).
    pub fn is_durability_call(&self) -> bool {
        matches!(self, Op::Sync { .. } | Op::Write { dsync: true, .. })
    }
}

#[derive(Clone)]
pub struct Model {
    nodes: BTreeMap<Ino, Node>,
    next: Ino,
    rules: Rules,
    /// Every change made since `record`, in order.
    trace: Option<Vec<Op>>,
}

impl Default for Model {
    fn default() -> Model {
        Model::new(Rules::POSIX)
    }
}

impl Model {
    /// An empty file system: its root directory, durable.
    pub fn new(rules: Rules) -> Model {
        let nodes = BTreeMap::from([(ROOT, Node::Dir(Dir::default()))]);
        Model { nodes, next: ROOT + 1, rules, trace: None }
    }

    /// Records every change from now on. Returns the model as it is now,
    /// which the trace replays onto (through the same inode numbers).
    pub fn record(&mut self) -> Model {
        let start = Model { trace: None, ..self.clone() };
        self.trace = Some(Vec::new());
        start
    }

    /// The changes recorded since `record`, and stops recording.
    pub fn take_trace(&mut self) -> Vec<Op> {
        self.trace.take().unwrap_or_default()
    }

    fn note(&mut self, op: impl FnOnce() -> Op) {
        if let Some(trace) = &mut self.trace {
            trace.push(op());
        }
    }

    /// Makes one recorded change again.
    pub fn apply(&mut self, op: &Op) -> Result<(), Errno> {
        match op {
            Op::Create { parent, name, kind } => self.create(*parent, name, kind.clone()).map(|_| ()),
            Op::Write { ino, offset, data, dsync } => self.write(*ino, *offset, data, *dsync),
            Op::Truncate { ino, size } => self.truncate(*ino, *size),
            Op::Sync { ino } => self.sync(*ino),
            Op::Unlink { parent, name, dir } => self.unlink(*parent, name, *dir),
            Op::Link { ino, parent, name } => self.link(*ino, *parent, name),
            Op::Rename { parent, name, to_parent, to_name } => self.rename(*parent, name, *to_parent, to_name),
            Op::Forget { ino } => {
                self.forget(*ino);
                Ok(())
            }
        }
    }

    /// Every file and directory a reader reaches now, by path from the
    /// root ("" for the root; directories as `None`, files with their
    /// bytes): what a crash state is compared and written out by.
    pub fn view(&self) -> View {
        let mut out = BTreeMap::new();
        let mut todo = vec![(String::new(), ROOT)];
        while let Some((path, ino)) = todo.pop() {
            match self.nodes.get(&ino) {
                Some(Node::Dir(d)) => {
                    for (name, child) in &d.current {
                        todo.push((format!("{path}/{name}"), *child));
                    }
                    out.insert(path, None);
                }
                Some(Node::File(f)) => {
                    out.insert(path, Some(f.current.clone()));
                }
                None => {}
            }
        }
        out
    }

    fn dir(&self, ino: Ino) -> Result<&Dir, Errno> {
        match self.nodes.get(&ino) {
            Some(Node::Dir(d)) => Ok(d),
            Some(Node::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> Result<&mut Dir, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(Node::Dir(d)) => Ok(d),
            Some(Node::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn file(&self, ino: Ino) -> Result<&File, Errno> {
        match self.nodes.get(&ino) {
            Some(Node::File(f)) => Ok(f),
            Some(Node::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn file_mut(&mut self, ino: Ino) -> Result<&mut File, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(Node::File(f)) => Ok(f),
            Some(Node::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    pub fn kind(&self, ino: Ino) -> Option<Kind> {
        match self.nodes.get(&ino)? {
            Node::File(_) => Some(Kind::File),
            Node::Dir(_) => Some(Kind::Dir),
        }
    }

    pub fn lookup(&self, parent: Ino, name: &str) -> Result<Ino, Errno> {
        self.dir(parent)?.current.get(name).copied().ok_or(Errno::ENOENT)
    }

    /// The entries of a directory, by name.
    pub fn entries(&self, dir: Ino) -> Result<Vec<(String, Ino)>, Errno> {
        Ok(self.dir(dir)?.current.iter().map(|(n, i)| (n.clone(), *i)).collect())
    }

    /// A file's size, or a directory's number of entries.
    pub fn size(&self, ino: Ino) -> Result<u64, Errno> {
        match self.nodes.get(&ino) {
            Some(Node::File(f)) => Ok(f.current.len() as u64),
            Some(Node::Dir(d)) => Ok(d.current.len() as u64),
            None => Err(Errno::ENOENT),
        }
    }

    /// How many entries name `ino` now (a directory: 2, as is customary).
    pub fn links(&self, ino: Ino) -> u32 {
        match self.nodes.get(&ino) {
            Some(Node::Dir(_)) => 2,
            Some(Node::File(_)) => self
                .nodes
                .values()
                .filter_map(|n| match n {
                    Node::Dir(d) => Some(d.current.values().filter(|i| **i == ino).count() as u32),
                    Node::File(_) => None,
                })
                .sum(),
            None => 0,
        }
    }

    /// A new file or directory under `parent`, named `name`: its entry is
    /// not durable until `parent` is synced.
    pub fn create(&mut self, parent: Ino, name: &str, kind: Kind) -> Result<Ino, Errno> {
        if self.dir(parent)?.current.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next;
        self.next += 1;
        let node = match &kind {
            Kind::File => Node::File(File::default()),
            Kind::Dir => Node::Dir(Dir::default()),
        };
        self.nodes.insert(ino, node);
        self.dir_mut(parent)?.current.insert(name.to_string(), ino);
        self.note(|| Op::Create { parent, name: name.to_string(), kind });
        Ok(ino)
    }

    pub fn read(&self, ino: Ino, offset: u64, len: usize) -> Result<Vec<u8>, Errno> {
        let f = self.file(ino)?;
        let start = (offset as usize).min(f.current.len());
        let end = start.saturating_add(len).min(f.current.len());
        Ok(f.current[start..end].to_vec())
    }

    /// Writes `data` at `offset`; `dsync`: written with `O_DSYNC` or
    /// `RWF_DSYNC`, so durable at once.
    pub fn write(&mut self, ino: Ino, offset: u64, data: &[u8], dsync: bool) -> Result<(), Errno> {
        let durable_too = dsync && self.rules.dsync_writes_are_durable;
        let f = self.file_mut(ino)?;
        put(&mut f.current, offset, data);
        if durable_too {
            put(&mut f.durable, offset, data);
        }
        self.note(|| Op::Write { ino, offset, data: data.to_vec(), dsync });
        Ok(())
    }

    pub fn truncate(&mut self, ino: Ino, size: u64) -> Result<(), Errno> {
        self.file_mut(ino)?.current.resize(size as usize, 0);
        self.note(|| Op::Truncate { ino, size });
        Ok(())
    }

    /// `fsync` or `fdatasync` of a file (its bytes and size), or `fsync` of
    /// a directory (its entries).
    pub fn sync(&mut self, ino: Ino) -> Result<(), Errno> {
        match self.nodes.get_mut(&ino) {
            Some(Node::File(f)) => f.durable.clone_from(&f.current),
            Some(Node::Dir(d)) => d.durable.clone_from(&d.current),
            None => return Err(Errno::ENOENT),
        }
        self.note(|| Op::Sync { ino });
        Ok(())
    }

    /// Removes the entry `name` of `parent` (a directory only when `dir`,
    /// and only an empty one).
    pub fn unlink(&mut self, parent: Ino, name: &str, dir: bool) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        match (self.nodes.get(&ino), dir) {
            (Some(Node::Dir(d)), true) if !d.current.is_empty() => return Err(Errno::ENOTEMPTY),
            (Some(Node::Dir(_)), false) => return Err(Errno::EISDIR),
            (Some(Node::File(_)), true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        self.dir_mut(parent)?.current.remove(name);
        self.note(|| Op::Unlink { parent, name: name.to_string(), dir });
        Ok(())
    }

    /// A second name for a file.
    pub fn link(&mut self, ino: Ino, parent: Ino, name: &str) -> Result<(), Errno> {
        self.file(ino)?;
        if self.dir(parent)?.current.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        self.dir_mut(parent)?.current.insert(name.to_string(), ino);
        self.note(|| Op::Link { ino, parent, name: name.to_string() });
        Ok(())
    }

    /// Moves `parent/name` to `to_parent/to_name`, replacing a file there
    /// (or an empty directory, when a directory moves).
    pub fn rename(&mut self, parent: Ino, name: &str, to_parent: Ino, to_name: &str) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        self.dir(to_parent)?;
        if let Ok(there) = self.lookup(to_parent, to_name) {
            if there == ino {
                return Ok(());
            }
            match (self.kind(ino), self.nodes.get(&there)) {
                (Some(Kind::File), Some(Node::Dir(_))) => return Err(Errno::EISDIR),
                (Some(Kind::Dir), Some(Node::File(_))) => return Err(Errno::ENOTDIR),
                (Some(Kind::Dir), Some(Node::Dir(d))) if !d.current.is_empty() => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
        }
        if self.kind(ino) == Some(Kind::Dir) && self.within(to_parent, ino) {
            return Err(Errno::EINVAL);
        }
        self.dir_mut(parent)?.current.remove(name);
        self.dir_mut(to_parent)?.current.insert(to_name.to_string(), ino);
        self.note(|| Op::Rename { parent, name: name.to_string(), to_parent, to_name: to_name.to_string() });
        Ok(())
    }

    /// Whether `ino` is `dir` or below it (now).
    fn within(&self, ino: Ino, dir: Ino) -> bool {
        if ino == dir {
            return true;
        }
        let mut seen = BTreeSet::new();
        let mut todo = vec![dir];
        while let Some(d) = todo.pop() {
            if !seen.insert(d) {
                continue;
            }
            if let Some(Node::Dir(entries)) = self.nodes.get(&d) {
                for &child in entries.current.values() {
                    if child == ino {
                        return true;
                    }
                    todo.push(child);
                }
            }
        }
        false
    }

    /// Everything as it is now made durable: the state a cut leaves when
    /// whatever was written had reached the disk by chance.
    pub fn keep_all(&mut self) {
        for node in self.nodes.values_mut() {
            match node {
                Node::File(f) => f.durable.clone_from(&f.current),
                Node::Dir(d) => d.durable.clone_from(&d.current),
            }
        }
        self.cut();
    }

    /// Cuts the power: every file and directory returns to its durable
    /// state, and what no durable entry reaches is gone.
    pub fn cut(&mut self) -> Cut {
        let mut cut = Cut::default();
        let rules = self.rules;
        for node in self.nodes.values_mut() {
            match node {
                Node::File(f) => {
                    if !rules.data_needs_sync {
                        f.durable.clone_from(&f.current);
                    }
                    if f.current != f.durable {
                        cut.files_reverted += 1;
                        f.current.clone_from(&f.durable);
                    }
                }
                Node::Dir(d) => {
                    if !rules.entries_need_dir_sync {
                        d.durable.clone_from(&d.current);
                    }
                    if d.current != d.durable {
                        cut.dirs_reverted += 1;
                        d.current.clone_from(&d.durable);
                    }
                }
            }
        }
        if rules.unreachable_is_gone {
            let mut reached = BTreeSet::from([ROOT]);
            let mut todo = vec![ROOT];
            while let Some(d) = todo.pop() {
                if let Some(Node::Dir(entries)) = self.nodes.get(&d) {
                    for &child in entries.durable.values() {
                        if reached.insert(child) {
                            todo.push(child);
                        }
                    }
                }
            }
            let before = self.nodes.len();
            self.nodes.retain(|ino, _| reached.contains(ino));
            cut.nodes_gone = (before - self.nodes.len()) as u64;
        }
        cut
    }

    /// Whether `ino` still exists (an unlinked file lives while open; the
    /// FUSE layer forgets it once the kernel does).
    pub fn exists(&self, ino: Ino) -> bool {
        self.nodes.contains_key(&ino)
    }

    /// Drops a file or directory that no entry names any longer (the
    /// kernel forgot it, or it was unlinked and closed).
    pub fn forget(&mut self, ino: Ino) {
        if ino != ROOT && self.links(ino) == 0 && self.kind(ino) == Some(Kind::File) {
            let named_durably =
                self.nodes.values().any(|n| matches!(n, Node::Dir(d) if d.durable.values().any(|i| *i == ino)));
            if !named_durably {
                self.nodes.remove(&ino);
                self.note(|| Op::Forget { ino });
            }
        }
    }
}

/// What a reader finds in a file system: path → a directory (`None`) or a
/// file's bytes.
pub type View = BTreeMap<String, Option<Vec<u8>>>;

/// Every crash state a power cut could leave during a run traced from the
/// file system `start` (`Model::record`'s), each handed to `check` once
/// (as a file system, and as what a reader finds in it) with the number of ops
/// it follows: after each op, the state with nothing unsynced kept (the
/// cut) and the state with everything kept (whatever was written reached
/// the disk by chance); and for each write that spans a sector boundary,
/// the power failing in its middle (`torn_prefix`: the sectors before the
/// boundary nearest its middle written, on top of the cut before it).
/// Between two durability calls these are the states after every write
/// since the last one, kept or not; each distinct state is handed over
/// once. Returns how many there were.
pub fn crash_states(start: Model, trace: &[Op], mut check: impl FnMut(usize, Model, View)) -> Result<u64, String> {
    use std::hash::{Hash, Hasher};
    let mut model = start;
    let mut seen = BTreeSet::new();
    let mut offer = |at: usize, state: Model| {
        let view = state.view();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        view.hash(&mut h);
        if seen.insert(h.finish()) {
            check(at, state, view);
        }
    };
    for at in 0..=trace.len() {
        if at > 0 {
            // The power failing while this write was under way: the
            // sectors up to a sector boundary near its middle reached the
            // disk, the rest did not (a torn write, what checksums are for).
            if let Op::Write { ino, offset, data, .. } = &trace[at - 1] {
                if let Some(torn) = torn_prefix(*offset, data.len()) {
                    let mut cut = model.clone();
                    cut.write(*ino, *offset, &data[..torn], true).map_err(|e| format!("op {}: {e}", at - 1))?;
                    cut.cut();
                    offer(at, cut);
                }
            }
            model
                .apply(&trace[at - 1])
                .map_err(|e| format!("op {}: {:?} failed on replay: {e}", at - 1, trace[at - 1]))?;
        }
        let mut kept = model.clone();
        kept.keep_all();
        offer(at, kept);
        let mut cut = model.clone();
        cut.cut();
        offer(at, cut);
    }
    Ok(seen.len() as u64)
}

/// Sectors, for torn writes.
const SECTOR_BYTES: u64 = 512;

/// How much of a write of `len` bytes at `offset` a power failure in its
/// middle leaves: up to the sector boundary nearest its middle, if one
/// falls strictly inside it.
fn torn_prefix(offset: u64, len: usize) -> Option<usize> {
    let middle = offset + len as u64 / 2;
    let boundary = (middle + SECTOR_BYTES / 2) / SECTOR_BYTES * SECTOR_BYTES;
    (boundary > offset && boundary < offset + len as u64).then(|| (boundary - offset) as usize)
}

/// Writes a view out under `root` (which exists): directories mode 0700,
/// files 0600.
pub fn write_view(view: &View, root: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    for (path, bytes) in view {
        let at = root.join(path.trim_start_matches('/'));
        match bytes {
            None if path.is_empty() => {}
            None => std::fs::DirBuilder::new().mode(0o700).create(&at)?,
            Some(b) => {
                std::fs::write(&at, b)?;
                std::fs::set_permissions(&at, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            }
        }
    }
    Ok(())
}

/// Writes `data` into `bytes` at `offset`, zero-filling a gap.
fn put(bytes: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let offset = offset as usize;
    if bytes.len() < offset + data.len() {
        bytes.resize(offset + data.len(), 0);
    }
    bytes[offset..offset + data.len()].copy_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn without(change: impl Fn(&mut Rules)) -> Rules {
        let mut r = Rules::POSIX;
        change(&mut r);
        r
    }

    /// A file made durable (its data and its name), then written again
    /// without a sync: after a cut it holds the synced bytes only.
    fn unsynced_data_is_lost(rules: Rules) -> bool {
        let mut m = Model::new(rules);
        let f = m.create(ROOT, "seg", Kind::File).unwrap();
        m.write(f, 0, b"synced", false).unwrap();
        m.sync(f).unwrap();
        m.sync(ROOT).unwrap();
        m.write(f, 6, b"+lost", false).unwrap();
        m.truncate(f, 11).unwrap();
        let cut = m.cut();
        m.read(f, 0, 64).unwrap() == b"synced" && cut.files_reverted == 1
    }

    #[test]
    fn rule_1_unsynced_data_is_lost_at_a_cut() {
        assert!(unsynced_data_is_lost(Rules::POSIX));
        assert!(!unsynced_data_is_lost(without(|r| r.data_needs_sync = false)), "the test bites");
    }

    /// An `O_DSYNC` write past an unsynced one: the dsync'd bytes survive,
    /// the unsynced ones before them read as zeros.
    fn a_dsync_write_survives_alone(rules: Rules) -> bool {
        let mut m = Model::new(rules);
        let f = m.create(ROOT, "wal", Kind::File).unwrap();
        m.sync(ROOT).unwrap();
        m.write(f, 0, b"aaaa", false).unwrap();
        m.write(f, 4, b"bbbb", true).unwrap();
        m.cut();
        m.read(f, 0, 64).unwrap() == b"\0\0\0\0bbbb"
    }

    #[test]
    fn rule_1_a_dsync_write_is_durable_by_itself_and_no_more() {
        assert!(a_dsync_write_survives_alone(Rules::POSIX));
        assert!(!a_dsync_write_survives_alone(without(|r| r.dsync_writes_are_durable = false)), "the test bites");
        assert!(!a_dsync_write_survives_alone(without(|r| r.data_needs_sync = false)), "the test bites");
    }

    /// A file synced, its directory not: after a cut the name is gone, and
    /// so is the file. A rename's two sides each need their directory.
    fn unsynced_entries_are_lost(rules: Rules) -> bool {
        let mut m = Model::new(rules);
        let d = m.create(ROOT, "wal", Kind::Dir).unwrap();
        let stage = m.create(ROOT, "stage", Kind::Dir).unwrap();
        m.sync(ROOT).unwrap();
        let f = m.create(d, "00000001.seg", Kind::File).unwrap();
        m.write(f, 0, b"group", false).unwrap();
        m.sync(f).unwrap();
        let g = m.create(stage, "snap", Kind::File).unwrap();
        m.sync(g).unwrap();
        m.sync(stage).unwrap();
        m.rename(stage, "snap", d, "00000002.seg").unwrap();
        m.sync(stage).unwrap(); // the old side only
        let cut = m.cut();
        let gone = m.lookup(d, "00000001.seg") == Err(Errno::ENOENT) && !m.exists(f);
        let neither = m.lookup(d, "00000002.seg").is_err() && m.lookup(stage, "snap").is_err() && !m.exists(g);
        gone && neither && cut.dirs_reverted == 1 && cut.nodes_gone == 2
    }

    #[test]
    fn rule_2_unsynced_directory_entries_are_lost_at_a_cut() {
        assert!(unsynced_entries_are_lost(Rules::POSIX));
        assert!(!unsynced_entries_are_lost(without(|r| r.entries_need_dir_sync = false)), "the test bites");
        assert!(!unsynced_entries_are_lost(without(|r| r.unreachable_is_gone = false)), "the test bites");
    }

    /// An unlink and a rename not made durable come back after a cut.
    #[test]
    fn rule_2_an_unsynced_removal_comes_back() {
        let mut m = Model::default();
        let f = m.create(ROOT, "a", Kind::File).unwrap();
        m.write(f, 0, b"x", false).unwrap();
        m.sync(f).unwrap();
        m.sync(ROOT).unwrap();
        m.unlink(ROOT, "a", false).unwrap();
        assert_eq!(m.lookup(ROOT, "a"), Err(Errno::ENOENT));
        m.cut();
        assert_eq!(m.lookup(ROOT, "a"), Ok(f));
        assert_eq!(m.read(f, 0, 8).unwrap(), b"x");
        m.rename(ROOT, "a", ROOT, "b").unwrap();
        m.sync(ROOT).unwrap();
        m.cut();
        assert_eq!(m.entries(ROOT).unwrap(), vec![("b".to_string(), f)]);
    }

    /// Rule 3 on its own: a directory whose entry was never synced takes
    /// everything below it, synced or not.
    fn a_lost_directory_takes_what_is_below(rules: Rules) -> bool {
        let mut m = Model::new(rules);
        let d = m.create(ROOT, "install", Kind::Dir).unwrap();
        let f = m.create(d, "seg", Kind::File).unwrap();
        m.write(f, 0, b"copied", false).unwrap();
        m.sync(f).unwrap();
        m.sync(d).unwrap();
        m.cut();
        !m.exists(d) && !m.exists(f)
    }

    #[test]
    fn rule_3_what_no_durable_entry_reaches_is_gone() {
        assert!(a_lost_directory_takes_what_is_below(Rules::POSIX));
        assert!(!a_lost_directory_takes_what_is_below(without(|r| r.unreachable_is_gone = false)), "the test bites");
    }

    #[test]
    fn what_was_synced_throughout_survives_any_number_of_cuts() {
        let mut m = Model::default();
        let d = m.create(ROOT, "sink", Kind::Dir).unwrap();
        m.sync(ROOT).unwrap();
        let tmp = m.create(d, ".tmp-1", Kind::File).unwrap();
        m.write(tmp, 0, b"batch", false).unwrap();
        m.sync(tmp).unwrap();
        m.link(tmp, d, "1.jsonl").unwrap();
        m.unlink(d, ".tmp-1", false).unwrap();
        m.sync(d).unwrap();
        for _ in 0..3 {
            assert_eq!(m.cut(), Cut::default());
            assert_eq!(m.entries(d).unwrap(), vec![("1.jsonl".to_string(), tmp)]);
            assert_eq!(m.read(tmp, 0, 16).unwrap(), b"batch");
        }
    }

    #[test]
    fn the_namespace_refuses_what_posix_refuses() {
        let mut m = Model::default();
        let d = m.create(ROOT, "d", Kind::Dir).unwrap();
        let f = m.create(d, "f", Kind::File).unwrap();
        assert_eq!(m.create(d, "f", Kind::File), Err(Errno::EEXIST));
        assert_eq!(m.unlink(ROOT, "d", true), Err(Errno::ENOTEMPTY));
        assert_eq!(m.unlink(ROOT, "d", false), Err(Errno::EISDIR));
        assert_eq!(m.rename(ROOT, "d", d, "inside"), Err(Errno::EINVAL));
        assert_eq!(m.write(d, 0, b"x", false), Err(Errno::EISDIR));
        assert_eq!(m.links(f), 1);
        m.link(f, ROOT, "g").unwrap();
        assert_eq!(m.links(f), 2);
    }

    #[test]
    fn a_trace_replays_to_the_same_files_and_yields_each_crash_state_once() {
        let mut m = Model::default();
        let start = m.record();
        let d = m.create(ROOT, "d", Kind::Dir).unwrap();
        let f = m.create(d, "f", Kind::File).unwrap();
        m.write(f, 0, b"ab", false).unwrap();
        m.sync(f).unwrap();
        m.sync(d).unwrap();
        m.sync(ROOT).unwrap();
        m.write(f, 2, b"cd", false).unwrap();
        m.create(d, "tmp", Kind::File).unwrap();
        let trace = m.take_trace();
        assert_eq!(trace.len(), 8);
        assert!(trace[3].is_durability_call() && !trace[2].is_durability_call());
        let mut states = Vec::new();
        let n = crash_states(start, &trace, |at, _, view| states.push((at, view))).unwrap();
        assert_eq!(n as usize, states.len());
        let root = |v: &View| v.keys().cloned().collect::<Vec<_>>();
        let file = |v: &View| v.get("/d/f").cloned().flatten();
        // The last state kept whole is what a reader saw at the end.
        assert!(states.iter().any(|(_, v)| *v == m.view()));
        // Before the root's sync a cut leaves nothing but the root: the
        // empty state, handed over at the start and never again.
        assert_eq!((states[0].0, root(&states[0].1)), (0, vec![String::new()]));
        assert!(states[1..].iter().all(|(_, v)| v.len() > 1));
        // The file: empty when made, "ab", "abcd" kept whole; never "cd".
        let files: BTreeSet<_> = states.iter().filter_map(|(_, v)| file(v)).collect();
        assert_eq!(files, BTreeSet::from([Vec::new(), b"ab".to_vec(), b"abcd".to_vec()]));
        // A state reached twice is handed over once.
        let views: BTreeSet<_> = states.iter().map(|(_, v)| v.clone()).collect();
        assert_eq!(views.len(), states.len());
        // Written out, it reads back as it was.
        let tmp = tempfile::tempdir().unwrap();
        write_view(&m.view(), tmp.path()).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("d/f")).unwrap(), b"abcd");
        assert_eq!(std::fs::read(tmp.path().join("d/tmp")).unwrap(), b"");
    }

    #[test]
    fn a_write_across_a_sector_boundary_is_also_torn_there() {
        assert_eq!(torn_prefix(0, 1024), Some(512));
        assert_eq!(torn_prefix(100, 1000), Some(412), "the boundary at 512, nearest the middle at 600");
        assert_eq!(torn_prefix(0, 300), None, "no boundary inside it");
        let mut m = Model::default();
        let f = m.create(ROOT, "f", Kind::File).unwrap();
        m.sync(ROOT).unwrap();
        let start = m.record();
        m.write(f, 0, &[7; 1024], true).unwrap();
        let trace = m.take_trace();
        let mut files = BTreeSet::new();
        crash_states(start, &trace, |_, _, view| {
            files.insert(view["/f"].clone().unwrap());
        })
        .unwrap();
        assert_eq!(files, BTreeSet::from([Vec::new(), vec![7; 512], vec![7; 1024]]));
    }
}
