//! A simulated disk holding WAL segment files.
//!
//! Writes land in a page cache (`current`) and become durable only when the
//! file is synced. On a crash, each unsynced write is lost, torn (a prefix
//! kept), or kept sector by sector at random, and a file created since the
//! directory was last synced may lose its directory entry. A failed sync
//! leaves the unwritten pages cached but clean (never written out), as Linux
//! does; WAL reads see the durable image, as `O_DIRECT` reads do. Creating a
//! segment may find the disk full. Bit
//! rot flips a durable bit in an older segment. Deleted files are recycled:
//! a new segment may start with an old segment's stale bytes.

use crate::rng::{Rng, Stream};
use skippr_core::SegmentId;
use std::collections::BTreeMap;

const SECTOR: usize = 512;

#[derive(Clone)]
struct File {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Unsynced writes, as (offset, len), in order.
    unsynced: Vec<(usize, usize)>,
    /// The directory entry is durable.
    linked: bool,
}

#[derive(Clone, Debug, Default)]
pub struct DiskStats {
    pub torn_writes: u64,
    pub lost_writes: u64,
    pub lost_dir_entries: u64,
    pub fsync_failures: u64,
    pub rot: u64,
}

#[derive(Clone)]
pub struct SimDisk {
    files: BTreeMap<SegmentId, File>,
    recycled: Vec<Vec<u8>>,
    rng: Rng,
    pub stats: DiskStats,
    /// Bumped by every change to what the disk holds (files, bytes, what is
    /// durable, directory entries): equal counts, equal disks.
    changes: u64,
}

impl SimDisk {
    pub fn new(seed: u64) -> SimDisk {
        SimDisk {
            files: BTreeMap::new(),
            recycled: Vec::new(),
            rng: Rng::new(seed, Stream::Disk),
            stats: DiskStats::default(),
            changes: 0,
        }
    }

    pub fn changes(&self) -> u64 {
        self.changes
    }

    pub fn list(&self) -> Vec<SegmentId> {
        self.files.keys().copied().collect()
    }

    /// Each file with its length, as a directory listing gives them.
    pub fn sizes(&self) -> Vec<(SegmentId, u64)> {
        self.files.iter().map(|(id, f)| (*id, f.current.len() as u64)).collect()
    }

    /// Reads what the device holds, bypassing the page cache (`O_DIRECT`):
    /// pages whose writeback failed are not seen. Recovery syncs first, so
    /// dirty pages a killed writer left are on the device by then.
    pub fn read(&self, segment: SegmentId) -> Option<Vec<u8>> {
        self.files.get(&segment).map(|f| f.durable.clone())
    }

    /// `len` bytes at `offset`, through the page cache (what the running
    /// process reads back).
    pub fn read_at(&self, segment: SegmentId, offset: usize, len: usize) -> Option<Vec<u8>> {
        self.files.get(&segment).and_then(|f| f.current.get(offset..offset + len)).map(<[u8]>::to_vec)
    }

    /// Reads through the page cache: what a recovery after a process kill
    /// reads once it has synced.
    pub fn read_cached(&self, segment: SegmentId) -> Option<Vec<u8>> {
        self.files.get(&segment).map(|f| f.current.clone())
    }

    /// Creates a preallocated file of `size` bytes starting with `header`,
    /// unsynced. Reuses a deleted file's bytes half of the time.
    pub fn create(&mut self, segment: SegmentId, header: &[u8], size: usize) {
        self.changes += 1;
        let mut bytes = if !self.recycled.is_empty() && self.rng.chance(0.5) {
            let i = self.rng.range(0, self.recycled.len() as u64 - 1) as usize;
            self.recycled.swap_remove(i)
        } else {
            Vec::new()
        };
        bytes.resize(size, 0);
        let durable = bytes.clone();
        let mut file = File { current: bytes, durable, unsynced: Vec::new(), linked: false };
        write_at(&mut file, 0, header);
        self.files.insert(segment, file);
    }

    /// Creates a file of `size` zero bytes starting with `header`, unsynced,
    /// reusing no deleted file's bytes.
    pub fn create_zeroed(&mut self, segment: SegmentId, header: &[u8], size: usize) {
        self.changes += 1;
        let bytes = vec![0; size];
        let mut file = File { current: bytes.clone(), durable: bytes, unsynced: Vec::new(), linked: false };
        write_at(&mut file, 0, header);
        self.files.insert(segment, file);
    }

    pub fn write(&mut self, segment: SegmentId, offset: usize, bytes: &[u8]) -> bool {
        match self.files.get_mut(&segment) {
            Some(file) if offset + bytes.len() <= file.current.len() => {
                self.changes += 1;
                write_at(file, offset, bytes);
                true
            }
            _ => false,
        }
    }

    /// `fdatasync` of the file (and of the directory when `dir`). On failure
    /// the unsynced pages are gone.
    pub fn sync(&mut self, segment: SegmentId, dir: bool, fail: bool) -> bool {
        let Some(file) = self.files.get_mut(&segment) else {
            return false;
        };
        self.changes += (!file.unsynced.is_empty() || (dir && !file.linked)) as u64;
        if fail {
            // As Linux does after a writeback error: the pages stay in the
            // cache, marked clean, so later reads through the cache still see
            // them and no later sync writes them out. A power cut drops them.
            self.stats.fsync_failures += 1;
            file.unsynced.clear();
            return false;
        }
        for &(off, len) in &file.unsynced {
            file.durable[off..off + len].copy_from_slice(&file.current[off..off + len]);
        }
        file.unsynced.clear();
        if dir {
            file.linked = true;
        }
        true
    }

    /// Syncs every file and the directory. On failure the unsynced pages of
    /// every file are gone.
    pub fn sync_all(&mut self, fail: bool) -> bool {
        let ids: Vec<SegmentId> = self.files.keys().copied().collect();
        let mut ok = true;
        for id in ids {
            ok &= self.sync(id, true, fail);
        }
        ok
    }

    /// Unlink, made durable at once.
    pub fn delete(&mut self, segment: SegmentId) {
        if let Some(file) = self.files.remove(&segment) {
            self.changes += 1;
            if self.recycled.len() < 4 {
                self.recycled.push(file.durable);
            }
        }
    }

    /// The machine loses power: only durable state survives, plus whatever
    /// of each unsynced write the disk happened to keep.
    pub fn crash(&mut self, lost_dir_entry: f64) {
        self.changes += 1;
        let mut gone = Vec::new();
        for (&id, file) in self.files.iter_mut() {
            if !file.linked && self.rng.chance(lost_dir_entry) {
                gone.push(id);
                continue;
            }
            for (off, len) in std::mem::take(&mut file.unsynced) {
                match self.rng.range(0, 3) {
                    0 => file.durable[off..off + len].copy_from_slice(&file.current[off..off + len]),
                    1 => self.stats.lost_writes += 1,
                    2 => {
                        self.stats.torn_writes += 1;
                        let keep = self.rng.range(0, len as u64) as usize;
                        file.durable[off..off + keep].copy_from_slice(&file.current[off..off + keep]);
                    }
                    _ => {
                        self.stats.torn_writes += 1;
                        let mut at = off;
                        while at < off + len {
                            let end = ((at / SECTOR + 1) * SECTOR).min(off + len);
                            if self.rng.chance(0.5) {
                                file.durable[at..end].copy_from_slice(&file.current[at..end]);
                            }
                            at = end;
                        }
                    }
                }
            }
            file.current.clone_from(&file.durable);
            file.linked = true;
        }
        for id in gone {
            self.stats.lost_dir_entries += 1;
            self.files.remove(&id);
        }
    }

    /// Flips one durable bit of `segment` below `end`. The world picks a
    /// segment that later commits follow, so the flip is detectable.
    pub fn rot(&mut self, segment: SegmentId, end: usize) -> bool {
        let Some(file) = self.files.get_mut(&segment) else {
            return false;
        };
        let at = self.rng.range(0, (end.min(file.durable.len()) - 1) as u64) as usize;
        let bit = 1u8 << self.rng.range(0, 7);
        self.changes += 1;
        file.durable[at] ^= bit;
        file.current[at] ^= bit;
        self.stats.rot += 1;
        true
    }
}

fn write_at(file: &mut File, offset: usize, bytes: &[u8]) {
    file.current[offset..offset + bytes.len()].copy_from_slice(bytes);
    file.unsynced.push((offset, bytes.len()));
}
