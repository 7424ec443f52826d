//! `skipprd bench`: measurements a user can repeat on their own disk
//! (BENCHMARKS.md). `wal`: the disk WAL's commit path against a plain
//! append + `fdatasync` loop; `e2e`: the daemon's whole pipeline against a
//! plain program that writes the same bytes with the same syncs;
//! `recovery`: a restart after a sink lagged until the WAL filled up.

use crate::exit;
use nix::sys::statfs::{statfs, FsType, EXT4_SUPER_MAGIC, OVERLAYFS_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC};
use std::path::Path;

mod e2e;
mod recovery;
mod wal;

pub use e2e::{e2e, BenchE2eArgs};
pub use recovery::{recovery, BenchRecoveryArgs};
pub use wal::{wal, BenchWalArgs};

/// Refuses a directory on tmpfs (fsync costs nothing there), creates it,
/// and prints the file system it is on. `Err` is the exit code.
fn prepare_dir(what: &str, dir: &Path) -> Result<(), i32> {
    // The file system of the directory, or of its nearest existing ancestor:
    // nothing is created on tmpfs.
    let existing = dir.ancestors().find(|a| a.exists()).unwrap_or(Path::new("."));
    let fs = match statfs(existing) {
        Ok(s) => s.filesystem_type(),
        Err(e) => {
            eprintln!("skipprd bench {what}: cannot stat {}: {e}", dir.display());
            return Err(exit::FAILED);
        }
    };
    if fs == TMPFS_MAGIC {
        eprintln!(
            "skipprd bench {what}: {} is on tmpfs, where fsync costs nothing; give --dir on a real disk",
            dir.display()
        );
        return Err(exit::CONFIG);
    }
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("skipprd bench {what}: cannot create {}: {e}", dir.display());
        return Err(exit::DATA_DIR);
    }
    println!("file system: {} ({})", fs_name(fs), dir.display());
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn fs_name(fs: FsType) -> String {
    match fs {
        f if f == EXT4_SUPER_MAGIC => "ext4".into(),
        f if f == XFS_SUPER_MAGIC => "xfs".into(),
        f if f == OVERLAYFS_SUPER_MAGIC => "overlayfs".into(),
        f => format!("{f:?}"),
    }
}
