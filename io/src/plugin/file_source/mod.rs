//! The built-in file source: tails the `*.jsonl` files of a directory, and
//! follows them through log rotation.
//!
//! Each `*.jsonl` name is a partition (a 31-bit hash of the name, so the
//! source needs no state of its own). Two names with the same hash cannot
//! both be read: the one the partition already reads (or else the first in
//! byte order) keeps it, and the other is left unread with an ERROR that
//! names both, once; every other file goes on. A record is one complete
//! line, without its `\n` or `\r\n`; a line longer than
//! `--record-bytes-max` stops the daemon (exit 10) naming the file and the
//! byte offset where it starts. The file behind a name is identified by more than its name: its
//! device and inode, and a checksum of its first bytes. A position is
//! `generation << 40 | byte offset`: each new file behind the name (after a
//! rotation or a truncation) is the next generation, so positions only grow.
//! The checkpoint names the file and its identity.
//!
//! - *Rename and recreate* (logrotate's default): the renamed file is found
//!   again by its inode under any name and read to its last complete line;
//!   once the new file behind the name holds a complete line (or the old one
//!   is gone), reading moves on to it from its start. Rotated names must
//!   leave the `*.jsonl` pattern (`app.jsonl.1`, as logrotate names them).
//! - *Truncation* (`copytruncate`): a file shorter than the position read,
//!   or whose first bytes changed, is a new generation read from its start,
//!   with a warning: lines written between the last read and the truncation
//!   may be lost.
//! - A file that vanishes, with nothing new behind its name, is logged and
//!   forgotten.
//!
//! A checkpoint of the earlier form (the bare file name, with positions that
//! are plain byte offsets) is taken over as generation 0 of the file now
//! behind the name.

pub mod settings;

use super::{Batch, PluginError, Source};
use skippr_core::format::Record;
use skippr_core::{Position, ResumePoint};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use tracing::{error, info, warn};

/// Bytes read from one file per read request, at most.
const FILE_READ_BYTES: usize = 4 << 20;
/// Bits of a position that hold the byte offset (1 TiB per generation).
const OFFSET_BITS: u32 = 40;
/// Bytes at the start of a file whose checksum tells it from another.
const FINGERPRINT_BYTES: u64 = 64;

pub struct FileSource {
    dir: PathBuf,
    stream: String,
    follow: bool,
    tracked: BTreeMap<u32, Tracked>,
    record_bytes_max: u64,
    /// Names left unread because another name has their partition (each
    /// reported once).
    colliding: BTreeSet<String>,
    /// Names whose last bytes (no newline yet) were reported at the end of
    /// a run without `follow`.
    unfinished: BTreeSet<String>,
    refused: Option<String>,
    /// Input an operator gave up: per partition, `(at, next)`.
    skips: Vec<(u32, Position, Position)>,
}

/// What the source knows of one partition.
#[derive(Clone, Debug, Default)]
struct Tracked {
    /// The `*.jsonl` name, once known (a resume without checkpoint learns it
    /// from the listing).
    name: Option<String>,
    /// The file being read: `None` until one is adopted.
    file: Option<FileId>,
    /// Checksum of the file's first `fingerprint.0` bytes.
    fingerprint: Option<(u64, u32)>,
    generation: u64,
    offset: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct FileId {
    dev: u64,
    ino: u64,
}

/// Every regular file of the directory, by identity.
type ById = BTreeMap<FileId, Found>;
/// The `*.jsonl` names, by partition.
type Named = BTreeMap<u32, (String, FileId)>;

/// A regular file found in the directory.
struct Found {
    path: PathBuf,
    id: FileId,
    len: u64,
}

/// The checkpoint: which file the positions are in.
#[derive(serde::Serialize, serde::Deserialize)]
struct Checkpoint {
    file: String,
    dev: u64,
    ino: u64,
    fp_len: u64,
    fp: u32,
}

impl FileSource {
    pub fn new(dir: &Path, stream: &str, follow: bool) -> FileSource {
        FileSource {
            dir: dir.to_path_buf(),
            stream: stream.to_string(),
            follow,
            tracked: BTreeMap::new(),
            record_bytes_max: skippr_core::rules::RECORD_BYTES_MAX_DEFAULT,
            colliding: BTreeSet::new(),
            unfinished: BTreeSet::new(),
            refused: None,
            skips: Vec::new(),
        }
    }

    /// Lines may be up to `bytes_max` bytes (`--record-bytes-max`).
    pub fn with_record_bytes_max(mut self, bytes_max: u64) -> FileSource {
        self.record_bytes_max = bytes_max;
        self
    }

    /// The partition id of a file name.
    pub fn partition_of(name: &str) -> u32 {
        let mut h: u32 = 0x811c_9dc5;
        for b in name.bytes() {
            h = (h ^ b as u32).wrapping_mul(0x0100_0193);
        }
        h & 0x7fff_ffff
    }

    /// The position of byte `offset` of generation `generation`.
    pub fn position(generation: u64, offset: u64) -> Position {
        Position(generation << OFFSET_BITS | offset)
    }

    /// Every regular file of the directory by identity, and the `*.jsonl`
    /// ones by partition.
    fn list(&mut self) -> Result<(ById, Named), PluginError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| PluginError(format!("cannot list {}: {e}", self.dir.display())))?;
        let (mut by_id, mut jsonl) = (BTreeMap::new(), BTreeMap::<String, FileId>::new());
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let id = FileId { dev: meta.dev(), ino: meta.ino() };
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".jsonl") {
                jsonl.insert(name, id);
            }
            by_id.insert(id, Found { path: entry.path(), id, len: meta.len() });
        }
        Ok((by_id, self.partitions(jsonl)))
    }

    /// The `*.jsonl` names by partition. Of two names with one partition,
    /// the name the partition reads keeps it, else the first in byte order;
    /// the other is reported (once) and left unread.
    fn partitions(&mut self, jsonl: BTreeMap<String, FileId>) -> Named {
        let mut named = Named::new();
        for (name, id) in jsonl {
            let partition = Self::partition_of(&name);
            let Some((other, _)) = named.get(&partition) else {
                named.insert(partition, (name, id));
                continue;
            };
            let reading = self.tracked.get(&partition).and_then(|t| t.name.as_deref());
            let (kept, left) = if reading == Some(name.as_str()) {
                (name.clone(), other.clone())
            } else {
                (other.clone(), name.clone())
            };
            if kept == name {
                named.insert(partition, (name, id));
            }
            if self.colliding.insert(left.clone()) {
                error!(
                    file = %left,
                    partition,
                    "{left} and {kept} in {} map to the same partition, so {left} is not read (every other file \
                     is); rename {left} (to a name that still ends in .jsonl) to have it read",
                    self.dir.display()
                );
            }
        }
        named
    }

    /// Decides which file each partition reads now: the one it was reading
    /// (under whatever name), a new generation behind its name, or none.
    fn settle(&mut self, by_id: &ById, named: &Named) {
        let owned: Vec<FileId> = self.tracked.values().filter_map(|t| t.file).collect();
        for (&partition, (name, id)) in named {
            // A rotated copy that kept the pattern belongs to its partition.
            if !self.tracked.contains_key(&partition) && owned.contains(id) {
                continue;
            }
            self.tracked.entry(partition).or_default().name.get_or_insert_with(|| name.clone());
        }
        let partitions: Vec<u32> = self.tracked.keys().copied().collect();
        for partition in partitions {
            let behind_name = named.get(&partition).and_then(|(_, id)| by_id.get(id));
            let t = self.tracked.get_mut(&partition).expect("listed above");
            let label = t.name.clone().unwrap_or_else(|| format!("partition {partition}"));
            let current = t.file.and_then(|id| by_id.get(&id));
            match (current, behind_name) {
                (None, None) => {
                    if t.file.is_some() || t.offset > 0 {
                        warn!(file = label, "the file vanished and nothing new has its name; forgetting it");
                    }
                    self.tracked.remove(&partition);
                }
                (None, Some(new)) if t.file.is_none() => {
                    // Adopted: a first sight, or a checkpoint of the earlier form.
                    t.file = Some(new.id);
                    check_truncated(t, new, &label);
                }
                (None, Some(new)) => {
                    info!(file = label, "the file being read is gone; reading the new one behind its name");
                    next_generation(t, new.id);
                }
                (Some(cur), new) => {
                    check_truncated(t, cur, &label);
                    let rotated = new.is_some_and(|n| n.id != cur.id);
                    if rotated && !has_line(cur, t.offset) && new.is_some_and(|n| has_line(n, 0)) {
                        info!(file = label, "the file was rotated and read to its end; reading the new one");
                        next_generation(t, new.expect("rotated").id);
                    }
                }
            }
        }
    }

    /// Reads up to `budget` complete lines of partition `partition`.
    fn read_partition(
        &mut self,
        partition: u32,
        found: &Found,
        budget: &mut usize,
    ) -> Result<(Option<Batch>, bool), PluginError> {
        let t = self.tracked.get_mut(&partition).expect("tracked");
        let len = found.len.max(t.offset);
        if *budget == 0 {
            return Ok((None, len == t.offset));
        }
        let mut file = std::fs::File::open(&found.path)
            .map_err(|e| PluginError(format!("cannot open {}: {e}", found.path.display())))?;
        // A window holds at least one line of the largest size with its
        // `\r\n`: a window without a newline is a line too long, or the
        // end of the file.
        let window = FILE_READ_BYTES.max(self.record_bytes_max as usize + 2);
        let mut buf = vec![0u8; ((len - t.offset) as usize).min(window)];
        let n = file
            .seek(SeekFrom::Start(t.offset))
            .and_then(|_| read_up_to(&mut file, &mut buf))
            .map_err(|e| PluginError(format!("cannot read {}: {e}", found.path.display())))?;
        buf.truncate(n);
        let (from, generation) = (t.offset, t.generation);
        let mut records = Vec::new();
        let mut at = 0usize;
        while *budget > 0 {
            let Some(nl) = memchr::memchr(b'\n', &buf[at..]) else { break };
            let offset = from + at as u64;
            let line = &buf[at..at + nl];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            records.push(Record { position: Self::position(generation, offset), bytes: line.to_vec() });
            at += nl + 1;
            *budget -= 1;
        }
        // Read to the end: nothing past the window, and no line left in it.
        let read = memchr::memchr(b'\n', &buf[at..]).is_none() && from + buf.len() as u64 >= len;
        // No line in a full window (a read with budget left took none).
        if records.is_empty() && !read && buf.len() == window {
            let cannot = |e: std::io::Error| PluginError(format!("cannot read {}: {e}", found.path.display()));
            let end = line_end(&mut file, from + buf.len() as u64).map_err(cannot)?;
            let (at, next) = (Self::position(generation, from), end.map(|end| Self::position(generation, end)));
            if let Some(next) = next.filter(|next| self.skips.contains(&(partition, at, *next))) {
                // Given up by the operator: read on after it.
                t.offset = next.0 & ((1 << OFFSET_BITS) - 1);
                return Ok((None, false));
            }
            let give_up = match next {
                Some(next) => format!(
                    "; or give up exactly this line: start again with the same settings and `{}` (recorded in the \
                     WAL)",
                    crate::driver::skip_input_arg(&self.stream, partition, at, next)
                ),
                None => " (the line has no newline yet, so it cannot be given up until it has one)".into(),
            };
            let why = format!(
                "the file source's {} holds a line longer than --record-bytes-max ({} bytes) at byte offset {}: \
                 nothing from it was committed; raise --record-bytes-max (at most {}), or move the file out of \
                 {}{give_up}",
                found.path.display(),
                self.record_bytes_max,
                from,
                skippr_core::rules::RECORD_BYTES_MAX_LIMIT,
                self.dir.display()
            );
            self.refused = Some(why.clone());
            return Err(PluginError(why));
        }
        if records.is_empty() {
            if read && !self.follow && !buf.is_empty() {
                let name = t.name.clone().unwrap_or_default();
                if self.unfinished.insert(name.clone()) {
                    warn!(
                        file = %name,
                        bytes = buf.len(),
                        offset = from,
                        "the file ends with bytes after its last newline: they are not read until a newline ends \
                         the line"
                    );
                }
            }
            return Ok((None, read));
        }
        let end = from + at as u64;
        if end >= 1 << OFFSET_BITS {
            return Err(PluginError(format!("{} is larger than 1 TiB: rotate it", found.path.display())));
        }
        t.offset = end;
        if t.fingerprint.is_none_or(|(n, _)| n < FINGERPRINT_BYTES.min(end)) {
            t.fingerprint = fingerprint(&found.path, end);
        }
        let (fp_len, fp) = t.fingerprint.unwrap_or_default();
        let name = t.name.clone().unwrap_or_default();
        let checkpoint = Checkpoint { file: name, dev: found.id.dev, ino: found.id.ino, fp_len, fp };
        let batch = Batch {
            partition,
            stream: self.stream.clone(),
            records,
            end: Self::position(generation, end),
            checkpoint: Some(serde_json::to_vec(&checkpoint).expect("a checkpoint serializes")),
            schema: None,
            window: skippr_core::Window::None,
            keys: Vec::new(),
        };
        Ok((Some(batch), read))
    }
}

impl Source for FileSource {
    fn streams(&self) -> Vec<String> {
        vec![self.stream.clone()]
    }

    fn pass_over(&mut self, skips: &[(u32, Position, Position)]) {
        self.skips = skips.to_vec();
    }

    fn open(&mut self, resume: &[ResumePoint]) -> Result<(), PluginError> {
        self.tracked = resume.iter().map(|r| (r.partition, resumed(r))).collect();
        Ok(())
    }

    fn read(&mut self, records_max: u32) -> Result<(Vec<Batch>, bool), PluginError> {
        let (by_id, named) = self.list()?;
        self.settle(&by_id, &named);
        let mut budget = records_max as usize;
        let (mut batches, mut all_read) = (Vec::new(), true);
        let partitions: Vec<(u32, FileId)> = self.tracked.iter().filter_map(|(p, t)| Some((*p, t.file?))).collect();
        for (partition, id) in partitions {
            let found = &by_id[&id];
            let (batch, read) = self.read_partition(partition, found, &mut budget)?;
            all_read &= read;
            batches.extend(batch);
        }
        if !self.follow && all_read && !self.colliding.is_empty() {
            if !batches.is_empty() {
                // Read again: the next read, with nothing left, refuses.
                return Ok((batches, false));
            }
            // Every other file is read: a run that ends must not end as if
            // these were too.
            let why = format!(
                "the file source read every file of {} but {}, whose names share a partition with another file's; \
                 rename them (to names that still end in .jsonl) and start again",
                self.dir.display(),
                self.colliding.iter().cloned().collect::<Vec<_>>().join(", ")
            );
            self.refused = Some(why.clone());
            return Err(PluginError(why));
        }
        Ok((batches, !self.follow && all_read))
    }

    fn ack(&mut self, _acks: &[(u32, Position)]) -> Result<(), PluginError> {
        Ok(())
    }

    fn refused(&self) -> Option<String> {
        self.refused.clone()
    }

    fn describe(&self, partition: u32, position: Position) -> String {
        let name = self.tracked.get(&partition).and_then(|t| t.name.clone()).unwrap_or_else(|| "?".into());
        let (generation, offset) = (position.0 >> OFFSET_BITS, position.0 & ((1 << OFFSET_BITS) - 1));
        format!("{} in {}, the line at byte offset {offset} (generation {generation})", name, self.dir.display())
    }
}

/// A partition as the host resumes it.
fn resumed(r: &ResumePoint) -> Tracked {
    let generation = r.position.0 >> OFFSET_BITS;
    let offset = r.position.0 & ((1 << OFFSET_BITS) - 1);
    let parsed = r.checkpoint.as_deref().and_then(|c| serde_json::from_slice::<Checkpoint>(c).ok());
    match parsed {
        Some(c) => Tracked {
            name: Some(c.file),
            file: Some(FileId { dev: c.dev, ino: c.ino }),
            fingerprint: (c.fp_len > 0).then_some((c.fp_len, c.fp)),
            generation,
            offset,
        },
        // The earlier form: the bare name, the file not yet identified.
        None => Tracked {
            name: r.checkpoint.as_deref().map(|c| String::from_utf8_lossy(c).into_owned()),
            generation,
            offset,
            ..Tracked::default()
        },
    }
}

/// A file shorter than what was read of it, or whose first bytes changed,
/// was truncated (and perhaps written again): read it as a new generation.
fn check_truncated(t: &mut Tracked, file: &Found, label: &str) {
    let shorter = file.len < t.offset;
    let rewritten = t.fingerprint.is_some_and(|(n, crc)| fingerprint(&file.path, n) != Some((n, crc)));
    if shorter || rewritten {
        warn!(
            file = label,
            position = t.offset,
            "the file was truncated: reading it again from its start; lines written between the last read and the \
             truncation may be lost"
        );
        next_generation(t, file.id);
    }
}

fn next_generation(t: &mut Tracked, file: FileId) {
    t.generation += 1;
    t.offset = 0;
    t.fingerprint = None;
    t.file = Some(file);
}

/// Does `file` hold a complete line past `offset`?
fn has_line(file: &Found, offset: u64) -> bool {
    if file.len <= offset {
        return false;
    }
    let Ok(mut f) = std::fs::File::open(&file.path) else { return false };
    let mut buf = vec![0u8; ((file.len - offset) as usize).min(FILE_READ_BYTES)];
    let n = f.seek(SeekFrom::Start(offset)).and_then(|_| read_up_to(&mut f, &mut buf)).unwrap_or(0);
    buf[..n].contains(&b'\n')
}

/// The checksum of the first `min(limit, FINGERPRINT_BYTES)` bytes.
fn fingerprint(path: &Path, limit: u64) -> Option<(u64, u32)> {
    let want = limit.min(FINGERPRINT_BYTES) as usize;
    let mut buf = vec![0u8; want];
    let n = std::fs::File::open(path).and_then(|mut f| read_up_to(&mut f, &mut buf)).ok()?;
    (n == want).then(|| (want as u64, crc32c::crc32c(&buf)))
}

/// Reads until `buf` is full or the file ends (it may be shorter than it
/// was when listed).
/// The offset just past the first newline at or after `from`, read in
/// bounded pieces (the line may be any length); `None` at the end of the
/// file without one.
fn line_end(file: &mut std::fs::File, from: u64) -> std::io::Result<Option<u64>> {
    let mut buf = vec![0u8; FILE_READ_BYTES];
    let mut at = from;
    file.seek(SeekFrom::Start(from))?;
    loop {
        let n = read_up_to(file, &mut buf)?;
        if let Some(nl) = memchr::memchr(b'\n', &buf[..n]) {
            return Ok(Some(at + nl as u64 + 1));
        }
        if n < buf.len() {
            return Ok(None);
        }
        at += n as u64;
    }
}

fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(src: &mut FileSource) -> Vec<Batch> {
        src.read(1000).unwrap().0
    }

    fn lines(batches: &[Batch]) -> Vec<String> {
        batches.iter().flat_map(|b| &b.records).map(|r| String::from_utf8(r.bytes.clone()).unwrap()).collect()
    }

    #[test]
    fn the_file_source_reads_complete_lines_and_resumes_at_byte_offsets() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a.jsonl"), b"{\"n\":1}\n{\"n\":2}\n{\"n\":3").unwrap();
        std::fs::write(tmp.path().join("ignored.txt"), b"x\n").unwrap();
        let mut src = FileSource::new(tmp.path(), "lines", false);
        src.open(&[]).unwrap();
        let (batches, done) = src.read(10).unwrap();
        assert!(done, "only an unterminated tail is left");
        assert_eq!(batches.len(), 1);
        let b = &batches[0];
        assert_eq!(b.partition, FileSource::partition_of("a.jsonl"));
        assert_eq!(b.records.iter().map(|r| r.position.0).collect::<Vec<_>>(), vec![0, 8]);
        assert_eq!(b.end, Position(16));
        // The line is completed later; a restarted source resumes at 16.
        std::fs::write(tmp.path().join("a.jsonl"), b"{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n").unwrap();
        let mut again = FileSource::new(tmp.path(), "lines", true);
        let resume = ResumePoint { partition: b.partition, position: b.end, checkpoint: b.checkpoint.clone() };
        again.open(&[resume]).unwrap();
        let (batches, done) = again.read(10).unwrap();
        assert!(!done, "following never ends");
        assert_eq!(lines(&batches), vec!["{\"n\":3}"]);
        assert_eq!(batches[0].end, Position(24));
    }

    #[test]
    fn rename_and_recreate_reads_the_old_file_to_its_end_then_the_new_one() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("app.jsonl");
        std::fs::write(&path, b"1\n2\n").unwrap();
        let mut src = FileSource::new(tmp.path(), "lines", true);
        src.open(&[]).unwrap();
        assert_eq!(lines(&read_all(&mut src)), vec!["1", "2"]);
        // The writer adds a line, logrotate renames, the writer adds one
        // more to its open descriptor, then reopens the new file.
        std::fs::write(&path, b"1\n2\n3\n").unwrap();
        std::fs::rename(&path, tmp.path().join("app.jsonl.1")).unwrap();
        std::fs::write(&path, b"").unwrap();
        assert_eq!(lines(&read_all(&mut src)), vec!["3"], "the renamed file is read to its end");
        std::fs::write(&path, b"4\n").unwrap();
        let batches = read_all(&mut src);
        assert_eq!(lines(&batches), vec!["4"]);
        assert_eq!(batches[0].records[0].position, FileSource::position(1, 0), "a new generation");
        std::fs::remove_file(tmp.path().join("app.jsonl.1")).unwrap();
        assert!(read_all(&mut src).is_empty(), "nothing is read twice");
    }

    #[test]
    fn a_truncated_file_is_a_new_generation_read_from_its_start() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("app.jsonl");
        std::fs::write(&path, b"first\nsecond\n").unwrap();
        let mut src = FileSource::new(tmp.path(), "lines", false);
        src.open(&[]).unwrap();
        assert_eq!(lines(&read_all(&mut src)), vec!["first", "second"]);
        // copytruncate, then the writer goes on (longer than before, so only
        // the changed first bytes tell).
        std::fs::write(&path, b"third line, longer than both\n").unwrap();
        let (batches, done) = src.read(1000).unwrap();
        assert_eq!(lines(&batches), vec!["third line, longer than both"]);
        assert_eq!(batches[0].end, FileSource::position(1, 29));
        assert!(done);
    }

    #[test]
    fn a_vanished_file_is_forgotten_and_a_checkpoint_of_the_earlier_form_is_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("old.jsonl");
        std::fs::write(&path, b"a\nb\nc\n").unwrap();
        let partition = FileSource::partition_of("old.jsonl");
        let mut src = FileSource::new(tmp.path(), "lines", false);
        let resume = ResumePoint { partition, position: Position(4), checkpoint: Some(b"old.jsonl".to_vec()) };
        src.open(&[resume]).unwrap();
        let (batches, done) = src.read(1000).unwrap();
        assert_eq!(lines(&batches), vec!["c"], "positions of the earlier form are byte offsets of generation 0");
        assert!(done);
        std::fs::remove_file(&path).unwrap();
        let (batches, done) = src.read(1000).unwrap();
        assert!(batches.is_empty() && done, "a vanished file ends nothing and hangs nothing");
    }
}
