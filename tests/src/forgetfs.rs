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
//! taken as whole here (the disk's write cache honours flushes, and a torn
//! sector is the checksums' business).

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

pub struct Model {
    nodes: BTreeMap<Ino, Node>,
    next: Ino,
    rules: Rules,
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
        Model { nodes, next: ROOT + 1, rules }
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
        let node = match kind {
            Kind::File => Node::File(File::default()),
            Kind::Dir => Node::Dir(Dir::default()),
        };
        self.nodes.insert(ino, node);
        self.dir_mut(parent)?.current.insert(name.to_string(), ino);
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
        Ok(())
    }

    pub fn truncate(&mut self, ino: Ino, size: u64) -> Result<(), Errno> {
        self.file_mut(ino)?.current.resize(size as usize, 0);
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
        Ok(())
    }

    /// A second name for a file.
    pub fn link(&mut self, ino: Ino, parent: Ino, name: &str) -> Result<(), Errno> {
        self.file(ino)?;
        if self.dir(parent)?.current.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        self.dir_mut(parent)?.current.insert(name.to_string(), ino);
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
            }
        }
    }
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
}
