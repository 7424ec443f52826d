//! The offsets store on disk: a redb database at `DATA_DIR/offsets.redb`.
//!
//! redb is a well-kept, pure-Rust embedded store with ACID transactions and
//! crash safety by copy-on-write and checksummed commits, and no C build step.
//! Keys are (pipeline, source, partition); values are the engine's exact
//! 24-byte `OffsetValue`, with the source's opaque checkpoint in a second
//! table. A write replaces a value only when its LSN is higher, inside one
//! write transaction, so a late write never moves a partition backwards.
//! The store is a cache of the WAL: deleting the file is harmless.

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use skippr_core::{IoError, IoReply, OffsetEntry, OffsetRow, OffsetValue, OffsetsOp, PartitionKey, SourceId};
use std::path::Path;
use tracing::warn;

const OFFSETS: TableDefinition<(&str, &str, u32), &[u8]> = TableDefinition::new("offsets");
const CHECKPOINTS: TableDefinition<(&str, &str, u32), &[u8]> = TableDefinition::new("checkpoints");
pub const OFFSETS_FILE: &str = "offsets.redb";

pub struct OffsetsDb {
    /// `None` after an error: redb refuses every later transaction on a
    /// database that saw an I/O error (a full disk), so the next request
    /// opens it again.
    db: std::sync::Mutex<Option<Database>>,
    path: std::path::PathBuf,
    pipeline: String,
    sources: Vec<String>,
}

/// One stored entry, as `skipprd offsets show` prints it, from either
/// store (this one or DynamoDB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOffset {
    pub pipeline: String,
    pub source: String,
    pub partition: u32,
    /// The raw value: 24 bytes when healthy.
    pub value: Vec<u8>,
    pub checkpoint: Option<Vec<u8>>,
}

impl StoredOffset {
    /// `pipeline source partition: position=… lsn=… records=…[ checkpoint=…]`.
    pub fn line(&self) -> String {
        let value = match OffsetValue::decode(&self.value) {
            Ok(v) => format!("position={} lsn={} records={}", v.position.0, v.lsn.0, v.records),
            Err(e) => format!("MALFORMED ({} bytes)", e.len),
        };
        let cp = self.checkpoint.as_ref().map(|c| format!(" checkpoint={}", String::from_utf8_lossy(c)));
        format!("{} {} {}: {value}{}", self.pipeline, self.source, self.partition, cp.unwrap_or_default())
    }
}

pub type DbResult<T> = Result<T, redb::Error>;

/// A new, empty store at `path`, whole or not at all: made under another
/// name, its tables committed (redb syncs the file), then renamed into
/// place and the directory synced. A power cut while redb lays out a new
/// file leaves one that is no database (found by the power-cut tests'
/// crash states), so the store's name appears only once its file is
/// complete; what a cut left under the other name is made again.
fn create_whole(data_dir: &Path, path: &Path) -> DbResult<()> {
    let new = path.with_extension("redb.new");
    match std::fs::remove_file(&new) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(redb::Error::Io(e)),
        _ => {}
    }
    let db = Database::create(&new)?;
    // Its checkpoints may hold a tap's state verbatim: the owner's only.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o600)).map_err(redb::Error::Io)?;
    let txn = db.begin_write()?;
    txn.open_table(OFFSETS)?;
    txn.open_table(CHECKPOINTS)?;
    txn.commit()?;
    drop(db);
    std::fs::rename(&new, path).map_err(redb::Error::Io)?;
    // The new name, made durable (redb syncs the file, not its directory).
    crate::disk_wal::sync_dir(data_dir).map_err(redb::Error::Io)
}

impl OffsetsDb {
    /// Opens or creates the store. `sources` maps the engine's `SourceId`s to
    /// names, which are what the store keeps.
    pub fn open(data_dir: &Path, pipeline: &str, sources: Vec<String>) -> DbResult<OffsetsDb> {
        let path = data_dir.join(OFFSETS_FILE);
        if !path.exists() {
            create_whole(data_dir, &path)?;
        }
        let db = Database::create(&path)?;
        Ok(OffsetsDb { db: std::sync::Mutex::new(Some(db)), path, pipeline: pipeline.to_string(), sources })
    }

    /// Runs `f` on the database, opening it again first if the last request
    /// failed, and dropping it if this one fails.
    fn with_db<T>(&self, f: impl FnOnce(&Database) -> DbResult<T>) -> DbResult<T> {
        let mut slot = self.db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if slot.is_none() {
            *slot = Some(Database::create(&self.path)?);
        }
        let result = f(slot.as_ref().expect("opened above"));
        if result.is_err() {
            *slot = None;
        }
        result
    }

    /// Every entry of this pipeline's configured sources.
    /// Performs one offsets request of the engine's.
    pub fn perform(&self, op: OffsetsOp) -> Result<IoReply, IoError> {
        let failed = |what: &str, e: redb::Error| {
            warn!(error = %e, "{what} failed");
            IoError::Failed
        };
        match op {
            OffsetsOp::Read => self.read().map(IoReply::Offsets).map_err(|e| failed("reading offsets", e)),
            OffsetsOp::Write { entries } => {
                self.write(&entries).map(|()| IoReply::Done).map_err(|e| failed("writing offsets", e))
            }
        }
    }

    pub fn read(&self) -> DbResult<Vec<OffsetRow>> {
        self.with_db(|db| self.read_from(db))
    }

    fn read_from(&self, db: &Database) -> DbResult<Vec<OffsetRow>> {
        let txn = db.begin_read()?;
        let offsets = txn.open_table(OFFSETS)?;
        let checkpoints = txn.open_table(CHECKPOINTS)?;
        let mut out = Vec::new();
        for (i, name) in self.sources.iter().enumerate() {
            let range =
                (self.pipeline.as_str(), name.as_str(), 0u32)..=(self.pipeline.as_str(), name.as_str(), u32::MAX);
            for row in offsets.range(range)? {
                let (k, v) = row?;
                let (_, _, partition) = k.value();
                let key = PartitionKey { source: SourceId(i as u16), partition };
                let checkpoint = checkpoints.get(k.value())?.map(|c| c.value().to_vec());
                out.push((key, v.value().to_vec(), checkpoint));
            }
        }
        Ok(out)
    }

    /// Applies the entries whose LSN is higher than what is stored, in one
    /// durable transaction.
    pub fn write(&self, entries: &[OffsetEntry]) -> DbResult<()> {
        self.with_db(|db| self.write_to(db, entries))
    }

    fn write_to(&self, db: &Database, entries: &[OffsetEntry]) -> DbResult<()> {
        let txn = db.begin_write()?;
        {
            let mut offsets = txn.open_table(OFFSETS)?;
            let mut checkpoints = txn.open_table(CHECKPOINTS)?;
            for e in entries {
                let key = (self.pipeline.as_str(), self.sources[e.key.source.0 as usize].as_str(), e.key.partition);
                let old = offsets.get(key)?.and_then(|v| OffsetValue::decode(v.value()).ok());
                if !OffsetValue::replaces(&e.value, old.as_ref()) {
                    continue;
                }
                let bytes = e.value.encode();
                assert_eq!(OffsetValue::decode(&bytes), Ok(e.value), "offset values round-trip");
                offsets.insert(key, bytes.as_slice())?;
                match &e.checkpoint {
                    Some(c) => checkpoints.insert(key, c.as_slice()).map(|_| ())?,
                    None => checkpoints.remove(key).map(|_| ())?,
                }
            }
        }
        txn.commit()?;
        Ok(())
    }
}

/// Every entry in the store at `path`, of every pipeline.
pub fn read_all(path: &Path) -> DbResult<Vec<StoredOffset>> {
    let db = Database::open(path)?;
    let txn = db.begin_read()?;
    let offsets = txn.open_table(OFFSETS)?;
    let checkpoints = txn.open_table(CHECKPOINTS)?;
    let mut out = Vec::new();
    for row in offsets.iter()? {
        let (k, v) = row?;
        let (pipeline, source, partition) = k.value();
        out.push(StoredOffset {
            pipeline: pipeline.to_string(),
            source: source.to_string(),
            partition,
            value: v.value().to_vec(),
            checkpoint: checkpoints.get(k.value())?.map(|c| c.value().to_vec()),
        });
    }
    Ok(out)
}

/// Deletes every entry of `pipeline` (every pipeline when `None`): the
/// deliberate way out when the store is ahead of the WAL. Returns how many.
pub fn reset(path: &Path, pipeline: Option<&str>) -> DbResult<usize> {
    let db = Database::create(path)?;
    let txn = db.begin_write()?;
    let mut n = 0;
    {
        let mut offsets = txn.open_table(OFFSETS)?;
        let mut checkpoints = txn.open_table(CHECKPOINTS)?;
        let mut keys: Vec<(String, String, u32)> = Vec::new();
        for row in offsets.iter()? {
            let (k, _) = row?;
            let (p, s, part) = k.value();
            keys.push((p.to_string(), s.to_string(), part));
        }
        for (p, s, part) in keys {
            if pipeline.is_none_or(|want| want == p) {
                offsets.remove((p.as_str(), s.as_str(), part))?;
                checkpoints.remove((p.as_str(), s.as_str(), part))?;
                n += 1;
            }
        }
    }
    txn.commit()?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skippr_core::{Lsn, Position};

    fn entry(partition: u32, position: u64, lsn: u64) -> OffsetEntry {
        OffsetEntry {
            key: PartitionKey { source: SourceId(0), partition },
            value: OffsetValue { position: Position(position), lsn: Lsn(lsn), records: position },
            checkpoint: Some(format!("cp{position}").into_bytes()),
        }
    }

    #[test]
    fn a_store_whose_creation_was_cut_short_is_made_again_under_its_own_name() {
        let tmp = tempfile::tempdir().unwrap();
        // What a power cut during redb's first layout left: a file that is
        // no database, under the name a store is made under.
        std::fs::write(tmp.path().join("offsets.redb.new"), vec![0; 73728]).unwrap();
        let db = OffsetsDb::open(tmp.path(), "main", vec!["s".into()]).unwrap();
        drop(db);
        assert!(!tmp.path().join("offsets.redb.new").exists());
        assert!(read_all(&tmp.path().join(OFFSETS_FILE)).unwrap().is_empty());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(tmp.path().join(OFFSETS_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn writes_never_move_a_partition_back_and_survive_reopening() {
        let tmp = tempfile::tempdir().unwrap();
        let db = OffsetsDb::open(tmp.path(), "main", vec!["gen".into()]).unwrap();
        db.write(&[entry(0, 10, 2), entry(1, 5, 2)]).unwrap();
        db.write(&[entry(0, 7, 1)]).unwrap(); // a late write
        db.write(&[entry(1, 9, 3)]).unwrap();
        drop(db);
        let db = OffsetsDb::open(tmp.path(), "main", vec!["gen".into()]).unwrap();
        let rows = db.read().unwrap();
        let positions: Vec<(u32, u64)> =
            rows.iter().map(|(k, v, _)| (k.partition, OffsetValue::decode(v).unwrap().position.0)).collect();
        assert_eq!(positions, vec![(0, 10), (1, 9)]);
        assert_eq!(rows[1].2.as_deref(), Some(b"cp9".as_slice()));
        assert!(rows.iter().all(|(_, v, _)| v.len() == 24));
        drop(db);
        assert_eq!(read_all(&tmp.path().join(OFFSETS_FILE)).unwrap().len(), 2);
        assert_eq!(reset(&tmp.path().join(OFFSETS_FILE), Some("main")).unwrap(), 2);
        assert!(read_all(&tmp.path().join(OFFSETS_FILE)).unwrap().is_empty());
    }
}
