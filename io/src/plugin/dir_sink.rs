//! The built-in `dir` sink.

use super::{PluginError, Sink};
use skippr_core::{CompactionId, Records, SinkOutcome};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The built-in directory sink: each destination batch becomes
/// `<dir>/<stream>/<seq, 20 digits>-<compaction_id>.jsonl`, one record per
/// line as emitted, written to a temporary file unique to the process,
/// fsynced, linked into place only if that name is free (`link` fails with
/// `EEXIST` otherwise, atomically), and the directory fsynced. A replay of
/// an existing id with identical bytes is `already_applied`; different
/// bytes, or another id under the same number, is `fatal`. So several
/// processes may apply into one directory at once (a deposed clustered
/// leader finishing an apply while its successor replays it): one link
/// wins, the others find its bytes.
pub struct DirSink {
    dir: PathBuf,
    /// The mode of each batch file; directories get it with `x` wherever it
    /// has `r` (0640 gives 0750).
    mode: u32,
    /// Per stream, the ids already in place by sequence number.
    seen: BTreeMap<String, BTreeMap<u64, CompactionId>>,
}

impl DirSink {
    pub fn open(dir: &Path) -> Result<DirSink, PluginError> {
        let sink = DirSink { dir: dir.to_path_buf(), mode: FILE_MODE_DEFAULT, seen: BTreeMap::new() };
        sink.create_dir(dir).map_err(|e| PluginError(format!("cannot create {}: {e}", dir.display())))?;
        Ok(sink)
    }

    /// Batch files get `mode` (`--sink-dir-mode`), directories the same
    /// with `x` wherever it has `r`.
    pub fn with_mode(mut self, mode: u32) -> DirSink {
        self.mode = mode;
        self
    }

    /// Made durable with its entry, so a batch synced and linked in it
    /// cannot vanish with it at a power cut.
    fn create_dir(&self, dir: &Path) -> std::io::Result<()> {
        crate::disk_wal::create_dir_durably(dir, self.mode | (self.mode & 0o444) >> 2)
    }

    fn load(&mut self, stream: &str) -> Result<&mut BTreeMap<u64, CompactionId>, PluginError> {
        if !self.seen.contains_key(stream) {
            let dir = self.dir.join(stream);
            let mut seen = BTreeMap::new();
            if dir.exists() {
                let entries = std::fs::read_dir(&dir).map_err(|e| PluginError(format!("{}: {e}", dir.display())))?;
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if let Some((seq, id)) = parse_name(&name) {
                        seen.insert(seq, id);
                    }
                }
            }
            self.seen.insert(stream.to_string(), seen);
        }
        Ok(self.seen.get_mut(stream).expect("inserted above"))
    }
}

fn file_name(seq: u64, id: CompactionId) -> String {
    format!("{seq:020}-{id}.jsonl")
}

/// A batch's temporary file, unique to this process and call: hidden, and
/// ending in `.tmp`, so that no reader's pattern for batches (`*.jsonl`)
/// takes one a killed process left behind for a batch.
fn temporary_name(seq: u64, id: CompactionId) -> String {
    let n = TEMPORARIES.fetch_add(1, Ordering::Relaxed);
    format!(".{seq:020}-{id}.{}-{n}.tmp", std::process::id())
}

fn parse_name(name: &str) -> Option<(u64, CompactionId)> {
    let stem = name.strip_suffix(".jsonl")?;
    let (seq, id) = stem.split_once('-')?;
    Some((seq.parse().ok()?, CompactionId(u64::from_str_radix(id, 16).ok()?)))
}

impl Sink for DirSink {
    fn progress(&mut self, streams: &[String]) -> Result<Vec<(String, u64)>, PluginError> {
        let mut out = Vec::new();
        for stream in streams {
            if let Some((&seq, _)) = self.load(stream)?.last_key_value() {
                out.push((stream.clone(), seq));
            }
        }
        Ok(out)
    }

    fn apply(
        &mut self,
        stream: &str,
        seq: u64,
        id: CompactionId,
        records: &Records,
    ) -> Result<SinkOutcome, PluginError> {
        let body = super::json_lines(records);
        let dir = self.dir.join(stream);
        let path = dir.join(file_name(seq, id));
        let err = |what: &str, e: std::io::Error| PluginError(format!("{what} {}: {e}", path.display()));
        match self.load(stream)?.get(&seq) {
            Some(existing) if *existing == id => {
                let on_disk = std::fs::read(&path).map_err(|e| err("cannot read", e))?;
                return Ok(if on_disk == body { SinkOutcome::AlreadyApplied } else { SinkOutcome::Fatal });
            }
            Some(_) => return Ok(SinkOutcome::Fatal),
            None => {}
        }
        self.create_dir(&dir).map_err(|e| err("cannot create the directory of", e))?;
        let tmp = dir.join(temporary_name(seq, id));
        let mut f = OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(self.mode)
            .open(&tmp)
            .map_err(|e| err("cannot write", e))?;
        let planted = crate::planted::armed(crate::planted::DriverFault::SinkLinkUnsynced);
        f.write_all(&body)
            .and_then(|_| if planted { Ok(()) } else { f.sync_all() })
            .map_err(|e| err("cannot write", e))?;
        drop(f);
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        let outcome = match linked {
            Ok(()) => SinkOutcome::Applied,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Another process applied this batch first: its bytes must be ours.
                let on_disk = std::fs::read(&path).map_err(|e| err("cannot read", e))?;
                if on_disk != body {
                    return Ok(SinkOutcome::Fatal);
                }
                SinkOutcome::AlreadyApplied
            }
            Err(e) => return Err(err("cannot link into", e)),
        };
        File::open(&dir).and_then(|d| d.sync_all()).map_err(|e| err("cannot sync the directory of", e))?;
        if another_id_under(&dir, seq, id).map_err(|e| err("cannot list the directory of", e))? {
            return Ok(SinkOutcome::Fatal);
        }
        self.load(stream)?.insert(seq, id);
        Ok(outcome)
    }
}

/// The batch files' mode unless `--sink-dir-mode` says otherwise.
pub const FILE_MODE_DEFAULT: u32 = 0o640;

/// Temporary files this process made, for unique names.
static TEMPORARIES: AtomicU64 = AtomicU64::new(0);

/// A batch of another id holds `seq` too (two WALs share the directory,
/// or a bug): both are refused.
fn another_id_under(dir: &Path, seq: u64, id: CompactionId) -> std::io::Result<bool> {
    let prefix = format!("{seq:020}-");
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && parse_name(&name).is_some_and(|(_, other)| other != id) {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_file_is_never_taken_for_a_batch() {
        let (a, b) = (temporary_name(7, CompactionId(0xab)), temporary_name(7, CompactionId(0xab)));
        assert_ne!(a, b, "unique per call");
        for name in [a, b] {
            assert!(name.starts_with('.') && name.ends_with(".tmp"), "{name}");
            assert!(!name.ends_with(".jsonl"), "{name}");
            assert_eq!(parse_name(&name), None, "{name}");
        }
    }

    #[test]
    fn the_dir_sink_is_idempotent_and_refuses_different_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let mut sink = DirSink::open(tmp.path()).unwrap();
        let recs: Records = [&b"{\"a\":1}"[..], b"{\"a\":2}"].into_iter().collect();
        let first: Records = recs.iter().take(1).collect();
        assert_eq!(sink.apply("s", 0, CompactionId(9), &recs).unwrap(), SinkOutcome::Applied);
        assert_eq!(sink.apply("s", 0, CompactionId(9), &recs).unwrap(), SinkOutcome::AlreadyApplied);
        let path = tmp.path().join("s").join("00000000000000000000-0000000000000009.jsonl");
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":1}\n{\"a\":2}\n");
        // A new process sees what is on disk.
        let mut again = DirSink::open(tmp.path()).unwrap();
        assert_eq!(again.apply("s", 0, CompactionId(9), &recs).unwrap(), SinkOutcome::AlreadyApplied);
        assert_eq!(again.apply("s", 0, CompactionId(9), &first).unwrap(), SinkOutcome::Fatal);
        assert_eq!(again.apply("s", 0, CompactionId(8), &recs).unwrap(), SinkOutcome::Fatal);
        assert_eq!(again.apply("s", 1, CompactionId(8), &recs).unwrap(), SinkOutcome::Applied);
    }
}
