//! The built-in `dir` sink.

pub mod settings;

use super::{PluginError, Sink};
use skippr_core::ledger::{conflict_message, judge, Digest, Entry, Scope, Verdict};
use skippr_core::{CompactionId, Records, SinkOutcome};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::{error, info};

/// The built-in directory sink: each destination batch becomes
/// `<dir>/<stream>/<scope tag>.<seq, 20 digits>-<compaction_id>.jsonl`, one
/// record per line as emitted, written to a temporary file unique to the
/// process, fsynced, linked into place only if that name is free (`link`
/// fails with `EEXIST` otherwise, atomically), and the directory fsynced.
/// What a name holds is judged by core's sink ledger: a replay of an id
/// with identical bytes is `already_applied`; other bytes, or another id
/// under the same number of the same scope, is `fatal`. The scope tag (the
/// pipeline and a hash of it with the WAL identity) keys every batch, so
/// two pipelines, or two WALs, may share a directory. Several processes may
/// apply into one directory at once (a deposed clustered leader finishing
/// an apply while its successor replays it): one link wins, the others
/// find its bytes.
///
/// Batches written before names carried a scope (`<seq>-<id>.jsonl`)
/// belong to the first scope that opens the directory after the upgrade:
/// it records itself in `<dir>/.skippr/legacy-owner`, and counts those
/// batches as its own.
pub struct DirSink {
    dir: PathBuf,
    /// The mode of each batch file; directories get it with `x` wherever it
    /// has `r` (0640 gives 0750).
    mode: u32,
    /// This pipeline's and WAL's tag in every name.
    tag: String,
    /// Whether the unscoped batches of before the upgrade are this scope's.
    legacy: bool,
    /// Per stream, the batches in place by sequence number: their id and
    /// file name.
    held: BTreeMap<String, BTreeMap<u64, (CompactionId, String)>>,
    /// This process's writer epoch for the scope: above every epoch an
    /// earlier opener took (`.skippr/<tag>.epoch-<n>` files). Temporary files
    /// carry it.
    epoch: u64,
    /// Whether the temporaries of earlier epochs were removed (at the first
    /// apply: the engine applies only as the writer).
    cleaned: bool,
}

/// The sink's own folder in the directory, hidden and holding no `*.jsonl`
/// (so a reader that takes every folder for a stream finds no batch in it):
/// writer epochs, and who owns the batches of before pipeline tags.
pub const OWN_DIR: &str = ".skippr";
/// In `OWN_DIR`: names the scope that owns the unscoped batches of before
/// the upgrade.
pub const LEGACY_OWNER: &str = "legacy-owner";
/// What `LEGACY_OWNER` holds when the directory had no batch of before
/// (no tag reads so: a tag ends in 16 hex digits after a `-`).
const NO_OWNER: &str = "none";

impl DirSink {
    pub fn open(dir: &Path, scope: &Scope) -> Result<DirSink, PluginError> {
        let mut sink = DirSink {
            dir: dir.to_path_buf(),
            mode: FILE_MODE_DEFAULT,
            tag: scope.tag(),
            legacy: false,
            held: BTreeMap::new(),
            epoch: 0,
            cleaned: false,
        };
        let own = dir.join(OWN_DIR);
        sink.create_dir(&own).map_err(|e| PluginError(format!("cannot create {}: {e}", own.display())))?;
        sink.legacy = sink.adopt_legacy().map_err(|e| {
            PluginError(format!("cannot decide whose the unscoped batches in {} are: {e}", dir.display()))
        })?;
        sink.epoch = sink
            .take_epoch()
            .map_err(|e| PluginError(format!("cannot take a writer epoch in {}: {e}", dir.display())))?;
        Ok(sink)
    }

    /// The next writer epoch of this scope: one above the highest an
    /// earlier opener took, claimed by creating its file in `.skippr/`
    /// (`O_EXCL`, so two openers at once never share one).
    fn take_epoch(&self) -> std::io::Result<u64> {
        let own = self.dir.join(OWN_DIR);
        loop {
            let mut highest = 0;
            for entry in std::fs::read_dir(&own)? {
                if let Some(n) = self.epoch_of_marker(&entry?.file_name().to_string_lossy()) {
                    highest = highest.max(n);
                }
            }
            let next = highest + 1;
            let path = own.join(format!("{}.epoch-{next:020}", self.tag));
            match OpenOptions::new().create_new(true).write(true).mode(self.mode).open(&path) {
                Ok(_) => {
                    crate::disk_wal::sync_dir(&own)?;
                    return Ok(next);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn epoch_of_marker(&self, name: &str) -> Option<u64> {
        let n = name.strip_prefix(self.tag.as_str())?.strip_prefix(".epoch-")?;
        (n.len() == 20).then(|| n.parse().ok()).flatten()
    }

    /// At the first apply, as the writer: removes the temporary files of
    /// this scope's earlier epochs (a killed or deposed writer's; a deposed
    /// one still linking finds its file gone, fails and retries, harmlessly)
    /// and their epoch files; where the batches of before pipeline tags are
    /// this scope's, the temporaries the daemon of then left too.
    fn clean(&mut self) -> std::io::Result<()> {
        let mut removed = 0;
        for entry in std::fs::read_dir(self.dir.join(OWN_DIR))? {
            let entry = entry?;
            if self.epoch_of_marker(&entry.file_name().to_string_lossy()).is_some_and(|n| n < self.epoch) {
                std::fs::remove_file(entry.path())?;
            }
        }
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if !entry.file_type()?.is_dir() || entry.file_name() == OWN_DIR {
                continue;
            }
            for file in std::fs::read_dir(entry.path())? {
                let file = file?;
                let name = file.file_name().to_string_lossy().into_owned();
                let dead = match temporary_epoch(&self.tag, &name) {
                    Some(n) => n < self.epoch,
                    None => self.legacy && is_unscoped_temporary(&name),
                };
                if dead {
                    match std::fs::remove_file(file.path()) {
                        Ok(()) => removed += 1,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        if removed > 0 {
            info!(dir = %self.dir.display(), removed, epoch = self.epoch, "dir sink: removed the temporary files earlier writers left");
        }
        Ok(())
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

    /// Whether the unscoped batches (written before names carried a scope)
    /// are this scope's: the owner file says so, or there is none yet and
    /// such batches exist, and this scope is the first to claim them.
    fn adopt_legacy(&self) -> std::io::Result<bool> {
        let own = self.dir.join(OWN_DIR);
        let owner = own.join(LEGACY_OWNER);
        if let Some(tag) = read_owner(&owner)? {
            return Ok(tag == self.tag);
        }
        // Decided once: with no batch of before, the file says so, and no
        // later start lists every stream's folder again.
        let claim = if any_unscoped_batch(&self.dir)? { self.tag.as_str() } else { NO_OWNER };
        let tmp = own.join(format!("{}.owner.{}.tmp", self.tag, std::process::id()));
        let mut f = OpenOptions::new().create(true).truncate(true).write(true).mode(self.mode).open(&tmp)?;
        f.write_all(format!("{claim}\n").as_bytes()).and_then(|_| f.sync_all())?;
        drop(f);
        // Another process may decide at the same time: one link wins.
        let linked = std::fs::hard_link(&tmp, &owner);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => crate::disk_wal::sync_dir(&own)?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let ours = read_owner(&owner)?.is_some_and(|tag| tag == self.tag);
        if ours {
            info!(dir = %self.dir.display(), tag = %self.tag, "dir sink: the batches written before names carried a pipeline are this pipeline's");
        }
        Ok(ours)
    }

    fn load(&mut self, stream: &str) -> Result<&mut BTreeMap<u64, (CompactionId, String)>, PluginError> {
        if !self.held.contains_key(stream) {
            let dir = self.dir.join(stream);
            let mut held = BTreeMap::new();
            if dir.exists() {
                let entries = std::fs::read_dir(&dir).map_err(|e| PluginError(format!("{}: {e}", dir.display())))?;
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if let Some((seq, id)) = self.ours(&name) {
                        held.insert(seq, (id, name));
                    }
                }
            }
            self.held.insert(stream.to_string(), held);
        }
        Ok(self.held.get_mut(stream).expect("inserted above"))
    }

    /// The number and id of a batch file of this scope.
    fn ours(&self, name: &str) -> Option<(u64, CompactionId)> {
        match parse_name(name)? {
            (Some(tag), seq, id) if tag == self.tag => Some((seq, id)),
            (None, seq, id) if self.legacy => Some((seq, id)),
            _ => None,
        }
    }

    /// What a file of this batch's number holds, for the rule: its id, and
    /// its digest where that id is the claim's (another id conflicts
    /// whatever its bytes).
    fn held_entry(&self, path: &Path, id: CompactionId, claim: CompactionId) -> Result<Entry, PluginError> {
        if id != claim {
            return Ok(Entry { id, digest: None });
        }
        let bytes = std::fs::read(path).map_err(|e| PluginError(format!("cannot read {}: {e}", path.display())))?;
        Ok(Entry { id, digest: Some(Digest::of_lines(&bytes)) })
    }

    fn refuse(&self, stream: &str, seq: u64, id: CompactionId, verdict: Verdict) -> SinkOutcome {
        if let Verdict::Conflict(c) = verdict {
            error!(dir = %self.dir.display(), "dir sink: {}", conflict_message(stream, seq, id, c));
        }
        verdict.outcome()
    }
}

/// A batch a destination holds: its stream, its number and its bytes.
pub type HeldBatch = (String, u64, Vec<u8>);

/// Every batch of `scope` under `dir`, in stream and number order: what
/// `skipprd dead-letters list` reads of the `dir` destination. A directory
/// that does not exist holds none.
pub fn read_scope(dir: &Path, scope: &Scope) -> std::io::Result<Vec<HeldBatch>> {
    let tag = scope.tag();
    let mut out = Vec::new();
    let streams = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in streams {
        let entry = entry?;
        let stream = entry.file_name().to_string_lossy().to_string();
        if stream.starts_with('.') || !entry.file_type()?.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(entry.path())? {
            let file = file?;
            let name = file.file_name().to_string_lossy().to_string();
            if let Some((Some(t), seq, _)) = parse_name(&name) {
                if t == tag {
                    out.push((stream.clone(), seq, std::fs::read(file.path())?));
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    Ok(out)
}

fn file_name(tag: &str, seq: u64, id: CompactionId) -> String {
    format!("{tag}.{seq:020}-{id}.jsonl")
}

/// A batch's temporary file, unique to this process and call: hidden,
/// named for its scope and writer epoch, and ending in `.tmp`, so that no
/// reader's pattern for batches (`*.jsonl`) takes one a killed process
/// left behind for a batch, and a later writer of the scope knows it dead.
fn temporary_name(tag: &str, epoch: u64, seq: u64, id: CompactionId) -> String {
    let n = TEMPORARIES.fetch_add(1, Ordering::Relaxed);
    format!(".{tag}.{epoch:020}.{seq:020}-{id}.{}-{n}.tmp", std::process::id())
}

/// The writer epoch of a temporary file of the scope `tag`.
fn temporary_epoch(tag: &str, name: &str) -> Option<u64> {
    let rest = name.strip_prefix('.')?.strip_prefix(tag)?.strip_prefix('.')?.strip_suffix(".tmp")?;
    let parts: Vec<&str> = rest.split('.').collect();
    match parts.as_slice() {
        [epoch, _, _] if epoch.len() == 20 => epoch.parse().ok(),
        _ => None,
    }
}

/// A temporary file of the daemon of before pipeline tags:
/// `.tmp-<pid>-<n>-<seq>-<id>.jsonl`, or `.<seq>-<id>.<pid>-<n>.tmp`.
fn is_unscoped_temporary(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('.') else { return false };
    if rest.starts_with("tmp-") && rest.ends_with(".jsonl") {
        return true;
    }
    let parts: Vec<&str> = rest.split('.').collect();
    matches!(parts.as_slice(), [numbered, _, "tmp"] if parse_name(&format!("{numbered}.jsonl")).is_some_and(|(tag, _, _)| tag.is_none()))
}

/// A batch file's scope tag (none for a batch of before the upgrade),
/// number and id.
fn parse_name(name: &str) -> Option<(Option<&str>, u64, CompactionId)> {
    let stem = name.strip_suffix(".jsonl")?;
    let (tag, numbered) = match stem.split_once('.') {
        Some((tag, rest)) if !tag.is_empty() => (Some(tag), rest),
        Some(_) => return None,
        None => (None, stem),
    };
    let (seq, id) = numbered.split_once('-')?;
    if seq.len() != 20 || id.len() != 16 {
        return None;
    }
    Some((tag, seq.parse().ok()?, CompactionId(u64::from_str_radix(id, 16).ok()?)))
}

fn read_owner(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// A batch without a scope tag in any stream's folder.
fn any_unscoped_batch(dir: &Path) -> std::io::Result<bool> {
    for stream in std::fs::read_dir(dir)? {
        let stream = stream?;
        if !stream.file_type()?.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(stream.path())? {
            if parse_name(&entry?.file_name().to_string_lossy()).is_some_and(|(tag, _, _)| tag.is_none()) {
                return Ok(true);
            }
        }
    }
    Ok(false)
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
        if !self.cleaned {
            self.clean().map_err(|e| {
                PluginError(format!("cannot remove earlier writers' temporary files in {}: {e}", self.dir.display()))
            })?;
            self.cleaned = true;
        }
        let body = super::json_lines(records);
        let claim = Entry { id, digest: Some(Digest::of_lines(&body)) };
        let dir = self.dir.join(stream);
        if let Some((held, name)) = self.load(stream)?.get(&seq).cloned() {
            let verdict = judge(claim, Some(self.held_entry(&dir.join(name), held, id)?));
            return Ok(self.refuse(stream, seq, id, verdict));
        }
        let path = dir.join(file_name(&self.tag, seq, id));
        let err = |what: &str, e: std::io::Error| PluginError(format!("{what} {}: {e}", path.display()));
        self.create_dir(&dir).map_err(|e| err("cannot create the directory of", e))?;
        let tmp = dir.join(temporary_name(&self.tag, self.epoch, seq, id));
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
        let verdict = match linked {
            Ok(()) => Verdict::New,
            // Another process applied this batch first: its bytes must be ours.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                judge(claim, Some(self.held_entry(&path, id, id)?))
            }
            Err(e) => return Err(err("cannot link into", e)),
        };
        File::open(&dir).and_then(|d| d.sync_all()).map_err(|e| err("cannot sync the directory of", e))?;
        if let Some(held) = self.another_id_under(&dir, seq, id).map_err(|e| err("cannot list the directory of", e))? {
            let verdict = judge(claim, Some(Entry { id: held, digest: None }));
            return Ok(self.refuse(stream, seq, id, verdict));
        }
        if let Verdict::Conflict(_) = verdict {
            return Ok(self.refuse(stream, seq, id, verdict));
        }
        let name = file_name(&self.tag, seq, id);
        self.load(stream)?.insert(seq, (id, name));
        Ok(verdict.outcome())
    }
}

impl DirSink {
    /// A batch of this scope with another id holds `seq` too (two processes
    /// of one scope raced with different batches: a bug, or two WALs given
    /// one identity): both are refused.
    fn another_id_under(&self, dir: &Path, seq: u64, id: CompactionId) -> std::io::Result<Option<CompactionId>> {
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name();
            if let Some((other_seq, other)) = self.ours(&name.to_string_lossy()) {
                if other_seq == seq && other != id {
                    return Ok(Some(other));
                }
            }
        }
        Ok(None)
    }
}

/// The batch files' mode unless `--sink-dir-mode` says otherwise.
pub const FILE_MODE_DEFAULT: u32 = 0o640;

/// Temporary files this process made, for unique names.
static TEMPORARIES: AtomicU64 = AtomicU64::new(0);

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(pipeline: &str) -> Scope {
        Scope::new(pipeline, "disk://test/wal/")
    }

    fn records(lines: &[&str]) -> Records {
        lines.iter().map(|l| l.as_bytes()).collect()
    }

    #[test]
    fn a_temporary_file_is_never_taken_for_a_batch() {
        let tag = scope("main").tag();
        let (a, b) = (temporary_name(&tag, 3, 7, CompactionId(0xab)), temporary_name(&tag, 3, 7, CompactionId(0xab)));
        assert_ne!(a, b, "unique per call");
        for name in [a, b] {
            assert!(name.starts_with(&format!(".{tag}.")) && name.ends_with(".tmp"), "{name}");
            assert!(!name.ends_with(".jsonl"), "{name}");
            assert_eq!(parse_name(&name), None, "{name}");
            assert_eq!(temporary_epoch(&tag, &name), Some(3), "{name}");
            assert_eq!(temporary_epoch(&scope("other").tag(), &name), None, "{name}");
            assert!(!is_unscoped_temporary(&name), "{name}");
        }
        assert!(is_unscoped_temporary(".tmp-123-4-00000000000000000007-00000000000000ab.jsonl"));
        assert!(is_unscoped_temporary(".00000000000000000007-00000000000000ab.123-4.tmp"));
        assert!(!is_unscoped_temporary("00000000000000000007-00000000000000ab.jsonl"));
    }

    #[test]
    fn a_writer_removes_the_temporaries_of_earlier_epochs_of_its_scope_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let recs = records(&["{\"a\":1}"]);
        let (main, other) = (scope("main").tag(), scope("other").tag());
        std::fs::create_dir(tmp.path().join("s")).unwrap();
        // Batches of before pipeline tags, so that "main" owns the old temporaries.
        std::fs::write(tmp.path().join("s/00000000000000000000-0000000000000001.jsonl"), b"{\"a\":1}\n").unwrap();
        let first = DirSink::open(tmp.path(), &scope("main")).unwrap();
        let of_other = DirSink::open(tmp.path(), &scope("other")).unwrap();
        let mut second = DirSink::open(tmp.path(), &scope("main")).unwrap();
        assert!(second.epoch > first.epoch, "epochs rise: {} then {}", first.epoch, second.epoch);
        let left = [
            temporary_name(&main, first.epoch, 3, CompactionId(3)),
            ".tmp-9-0-00000000000000000004-0000000000000004.jsonl".to_string(),
            ".00000000000000000005-0000000000000005.9-1.tmp".to_string(),
        ];
        let kept = [
            temporary_name(&main, second.epoch + 1, 6, CompactionId(6)),
            temporary_name(&other, of_other.epoch, 7, CompactionId(7)),
        ];
        for name in left.iter().chain(&kept) {
            std::fs::write(tmp.path().join("s").join(name), b"partial").unwrap();
        }
        assert_eq!(second.apply("s", 1, CompactionId(2), &recs).unwrap(), SinkOutcome::Applied);
        let mut names: Vec<String> = std::fs::read_dir(tmp.path().join("s"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut expected =
            vec!["00000000000000000000-0000000000000001.jsonl".to_string(), file_name(&main, 1, CompactionId(2))];
        expected.extend(kept);
        expected.sort();
        assert_eq!(names, expected, "the earlier epochs' and the old daemon's temporaries gone, no other");
        let marker = format!("{main}.epoch-{:020}", first.epoch);
        assert!(!tmp.path().join(OWN_DIR).join(marker).exists(), "the earlier epoch's file went with them");
        // Nothing of the sink's own beside the streams' folders.
        let top: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(top.iter().all(|n| n == "s" || n == OWN_DIR), "{top:?}");
    }

    #[test]
    fn names_carry_the_scope_and_old_names_parse_without_one() {
        let tag = scope("main").tag();
        let name = file_name(&tag, 3, CompactionId(0xab));
        assert_eq!(name, format!("{tag}.00000000000000000003-00000000000000ab.jsonl"));
        assert_eq!(parse_name(&name), Some((Some(tag.as_str()), 3, CompactionId(0xab))));
        assert_eq!(parse_name("00000000000000000003-00000000000000ab.jsonl"), Some((None, 3, CompactionId(0xab))));
        assert_eq!(parse_name("notes.jsonl"), None);
        assert_eq!(parse_name(".x.00000000000000000003-00000000000000ab.jsonl"), None);
    }

    #[test]
    fn the_dir_sink_is_idempotent_and_refuses_different_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let mut sink = DirSink::open(tmp.path(), &scope("main")).unwrap();
        let recs = records(&["{\"a\":1}", "{\"a\":2}"]);
        let first = records(&["{\"a\":1}"]);
        assert_eq!(sink.apply("s", 0, CompactionId(9), &recs).unwrap(), SinkOutcome::Applied);
        assert_eq!(sink.apply("s", 0, CompactionId(9), &recs).unwrap(), SinkOutcome::AlreadyApplied);
        let path = tmp.path().join("s").join(file_name(&scope("main").tag(), 0, CompactionId(9)));
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":1}\n{\"a\":2}\n");
        // A new process sees what is on disk.
        let mut again = DirSink::open(tmp.path(), &scope("main")).unwrap();
        assert_eq!(again.apply("s", 0, CompactionId(9), &recs).unwrap(), SinkOutcome::AlreadyApplied);
        assert_eq!(again.apply("s", 0, CompactionId(9), &first).unwrap(), SinkOutcome::Fatal);
        assert_eq!(again.apply("s", 0, CompactionId(8), &recs).unwrap(), SinkOutcome::Fatal);
        assert_eq!(again.apply("s", 1, CompactionId(8), &recs).unwrap(), SinkOutcome::Applied);
        assert_eq!(again.progress(&["s".into(), "t".into()]).unwrap(), vec![("s".to_string(), 1)]);
    }

    #[test]
    fn two_pipelines_share_a_directory_each_under_its_own_numbers() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut a, mut b) =
            (DirSink::open(tmp.path(), &scope("a")).unwrap(), DirSink::open(tmp.path(), &scope("b")).unwrap());
        let recs = records(&["{\"a\":1}"]);
        assert_eq!(a.apply("s", 0, CompactionId(1), &recs).unwrap(), SinkOutcome::Applied);
        assert_eq!(b.apply("s", 0, CompactionId(2), &recs).unwrap(), SinkOutcome::Applied);
        assert_eq!(b.apply("s", 0, CompactionId(2), &recs).unwrap(), SinkOutcome::AlreadyApplied);
        assert_eq!(a.apply("s", 0, CompactionId(2), &recs).unwrap(), SinkOutcome::Fatal);
        assert_eq!(std::fs::read_dir(tmp.path().join("s")).unwrap().count(), 2);
    }

    #[test]
    fn batches_of_before_the_upgrade_belong_to_the_first_scope_to_open_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let recs = records(&["{\"a\":1}"]);
        std::fs::create_dir(tmp.path().join("s")).unwrap();
        std::fs::write(tmp.path().join("s/00000000000000000000-0000000000000001.jsonl"), b"{\"a\":1}\n").unwrap();
        let mut old = DirSink::open(tmp.path(), &scope("main")).unwrap();
        assert_eq!(old.progress(&["s".into()]).unwrap(), vec![("s".to_string(), 0)]);
        assert_eq!(old.apply("s", 0, CompactionId(1), &recs).unwrap(), SinkOutcome::AlreadyApplied);
        assert_eq!(old.apply("s", 0, CompactionId(5), &recs).unwrap(), SinkOutcome::Fatal);
        assert_eq!(old.apply("s", 1, CompactionId(2), &recs).unwrap(), SinkOutcome::Applied);
        // The claim is durable and the owner's alone.
        let owner = std::fs::read_to_string(tmp.path().join(OWN_DIR).join(LEGACY_OWNER)).unwrap();
        assert_eq!(owner.trim(), scope("main").tag());
        let mut other = DirSink::open(tmp.path(), &scope("other")).unwrap();
        assert_eq!(other.progress(&["s".into()]).unwrap(), vec![]);
        assert_eq!(other.apply("s", 0, CompactionId(7), &recs).unwrap(), SinkOutcome::Applied);
        let mut again = DirSink::open(tmp.path(), &scope("main")).unwrap();
        assert_eq!(again.progress(&["s".into()]).unwrap(), vec![("s".to_string(), 1)]);
        // A directory with nothing from before is claimed by no one, for
        // good: a batch of the old form appearing later is nobody's.
        let fresh = tempfile::tempdir().unwrap();
        DirSink::open(fresh.path(), &scope("main")).unwrap();
        let owner = std::fs::read_to_string(fresh.path().join(OWN_DIR).join(LEGACY_OWNER)).unwrap();
        assert_eq!(owner.trim(), NO_OWNER);
        std::fs::create_dir(fresh.path().join("s")).unwrap();
        std::fs::write(fresh.path().join("s/00000000000000000000-0000000000000001.jsonl"), b"{\"a\":1}\n").unwrap();
        let mut late = DirSink::open(fresh.path(), &scope("main")).unwrap();
        assert_eq!(late.progress(&["s".into()]).unwrap(), vec![]);
    }
}
