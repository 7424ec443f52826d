//! Operator tools: `skipprd wal verify` and `skipprd offsets show|reset|init-table`.

use crate::config::{AwsArgs, OffsetsArgs, TableArgs, WalArgs, WalStorage};
use crate::exit;
use skippr_core::format::{scan, Frame, Recovery, Scanned, ScannedSegment, WalDamage};
use skippr_core::SegmentId;
use skippr_io::disk_wal::{list_dir, WAL_DIR};
use skippr_io::offsets_db::{read_all, reset, OFFSETS_FILE};
use std::path::Path;

/// Checks every segment of the S3 WAL at `bucket`/`prefix`, as
/// `wal_verify` does on disk. It lists and reads only: a listing does not
/// sweep leftovers here, the daemon's does.
pub fn wal_verify_s3(bucket: &str, prefix: &str, aws: &skippr_io::aws::AwsSettings) -> i32 {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime starts");
    let listed = runtime.block_on(async {
        let sdk = aws.load().await?;
        let wal = skippr_io::s3_wal::S3Wal::connect(&sdk, bucket, prefix).await?;
        let ids = wal.list_segments().await.map_err(|e| format!("cannot list {}: {e:?}", wal.location()))?;
        Ok::<_, String>((wal, ids))
    });
    let (wal, ids) = match listed {
        Ok(l) => l,
        Err(e) => {
            eprintln!("skipprd wal verify: {e}");
            return exit::REMOTE;
        }
    };
    // A window at a time, laid out as the daemon reads them.
    let walked = walk(ids, |id, offset, len| {
        runtime.block_on(wal.read_at(id, offset, len)).map_err(|e| format!("cannot read segment {}: {e:?}", id.0))
    });
    let location = wal.location();
    match walked {
        Ok(walked) => report(walked, true, |id| format!("{location}{:020}/", id.0)),
        Err(e) => {
            eprintln!("skipprd wal verify: {e}");
            exit::REMOTE
        }
    }
}

/// Checks every segment under `DATA_DIR/wal`, lists what it found, and exits
/// non-zero on corruption. Safe to run beside a live daemon (it only reads),
/// though the newest group may then look torn. It reads each segment once,
/// a window at a time, holding what recovery holds and a line per segment.
pub fn wal_verify(data_dir: &Path) -> i32 {
    let dir = data_dir.join(WAL_DIR);
    let (ids, strays) = match list_dir(&dir) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("skipprd wal verify: cannot list {}: {e}", dir.display());
            return exit::DATA_DIR;
        }
    };
    for path in &strays {
        println!("{}: not a segment, ignored", path.display());
    }
    match walk(ids, |id, offset, len| read_file_at(&dir, id, offset, len)) {
        Ok(walked) => report(walked, false, |id| dir.join(format!("{:020}.seg", id.0)).display().to_string()),
        Err(e) => {
            eprintln!("skipprd wal verify: {e}");
            exit::FAILED
        }
    }
}

/// `len` bytes of segment `id` under `dir` from `offset`, fewer at its end.
fn read_file_at(dir: &Path, id: SegmentId, offset: u64, len: usize) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::FileExt;
    let path = dir.join(format!("{:020}.seg", id.0));
    let file = std::fs::File::open(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// For a daemon that stopped because its offsets store or a sink holds more
/// than the disk WAL: where the WAL ends on bytes that are not a whole
/// commit group, said as `wal verify` says it, if it does.
pub fn disk_wal_tail(data_dir: &Path) -> Option<String> {
    let dir = data_dir.join(WAL_DIR);
    let (ids, _) = list_dir(&dir).ok()?;
    let tail = walk(ids, |id, offset, len| read_file_at(&dir, id, offset, len)).ok()?.tail?;
    Some(format!(
        "The WAL's segment {} ends at byte {} with {}; as more was acknowledged than the WAL holds before them, \
         damage is the likelier: check the disk before resetting anything",
        dir.join(format!("{:020}.seg", tail.segment.0)).display(),
        tail.offset,
        skippr_core::format::UNREADABLE_TAIL
    ))
}

/// Clustered mode: this host's segments scanned, and its committed prefix:
/// the oldest group it holds, the last its saved commit index covers, and
/// a digest of `from..=through` that operators compare between hosts
/// (`--from` the largest oldest, `--through` the smallest committed).
pub fn wal_verify_clustered(data_dir: &Path, from: Option<u64>, through: Option<u64>) -> i32 {
    let fail = |code: i32, what: String| {
        eprintln!("skipprd wal verify: {what}");
        code
    };
    let saved = match skippr_io::hard_state_file::HardStateFile::open(data_dir) {
        Ok((_, Some(saved))) => saved,
        Ok((_, None)) => return fail(exit::CONFIG, format!("{} holds no cluster identity", data_dir.display())),
        Err(e) => return fail(exit::WAL_CORRUPT, format!("this host's raft state cannot be read: {e}")),
    };
    let dir = data_dir.join(WAL_DIR);
    let (ids, _) = match list_dir(&dir) {
        Ok(l) => l,
        Err(e) => return fail(exit::DATA_DIR, format!("cannot list {}: {e}", dir.display())),
    };
    let mut files = Vec::new();
    for id in ids {
        match std::fs::read(dir.join(format!("{:020}.seg", id.0))) {
            Ok(bytes) => files.push((id, bytes)),
            Err(e) => return fail(exit::FAILED, format!("cannot read segment {}: {e}", id.0)),
        }
    }
    let view: Vec<_> = files.iter().map(|(id, b)| (*id, b.as_slice())).collect();
    let scanned = match scan(&view, false) {
        Ok(s) => s,
        Err(c) => {
            println!("CORRUPT: {:020}.seg at byte {}: {}", c.segment.0, c.offset, c.what);
            return exit::WAL_CORRUPT;
        }
    };
    let lsn = |v: Option<u64>| v.map(skippr_core::Lsn);
    let commit = saved.hard.commit;
    match skippr_core::cluster::prefix_digest(&view, &scanned, commit, lsn(from), lsn(through)) {
        Ok(d) => {
            println!(
                "node {} of cluster {:016x}: term {}, {} segments, committed groups {}..={} held",
                saved.members.node,
                saved.members.cluster,
                saved.hard.term,
                files.len(),
                d.oldest.0,
                d.committed.0
            );
            println!("committed prefix {}..={}: digest {:016x}", d.from.0, d.through.0, d.digest);
            exit::OK
        }
        Err(e) => fail(exit::FAILED, e),
    }
}

/// What one segment holds, for `wal verify`'s list.
struct SegmentLine {
    seg: ScannedSegment,
    groups: usize,
    lsns: Option<(u64, u64)>,
    records: usize,
}

/// What a streaming pass over the WAL found: recovery's verdict, a line per
/// segment, the operator's skips it still holds, and where it ends on bytes
/// that are not a whole commit group.
struct Walked {
    verdict: Result<(), WalDamage>,
    segments: Vec<SegmentLine>,
    skips: Vec<String>,
    tail: Option<skippr_core::format::UnreadableTail>,
}

/// Reads the listed segments once, in order, a window at a time
/// (`read_at(segment, offset, len)`, fewer bytes at a segment's end),
/// making recovery's checks: no segment missing, every group valid,
/// nothing missing before the oldest segment that a sink needs.
fn walk(
    ids: Vec<SegmentId>,
    mut read_at: impl FnMut(SegmentId, u64, usize) -> Result<Vec<u8>, String>,
) -> Result<Walked, String> {
    let mut recovery = Recovery::new(ids, false, false, 1 << 20).without_records();
    let (mut segments, mut skips, mut streams) = (Vec::new(), Vec::new(), Vec::<String>::new());
    let (mut groups, mut lsns, mut records) = (0usize, None::<(u64, u64)>, 0usize);
    let mut verdict = Ok(());
    while let Some(read) = recovery.next_read() {
        let bytes = read_at(read.segment, read.offset, read.len)?;
        verdict = recovery.feed_seeing(bytes, |item| match item {
            Scanned::Group(_, g) => {
                groups += 1;
                lsns = Some((lsns.map_or(g.lsn.0, |l| l.0), g.lsn.0));
                for frame in &g.frames {
                    match frame {
                        Frame::SourceBatch(b) => records += b.count() as usize,
                        Frame::Snapshot(s) => streams.clone_from(&s.names.streams),
                        Frame::Skipped(k) => skips.push(format!(
                            "skipped at lsn {}: stream {}, partition {}, positions {}..{}: {}",
                            g.lsn.0,
                            streams.get(k.stream.0 as usize).map_or_else(|| format!("#{}", k.stream.0), Clone::clone),
                            k.key.partition,
                            k.at.0,
                            k.next.0,
                            k.reason.escape_debug()
                        )),
                        Frame::BatchSkipped(k) => skips.push(format!(
                            "skipped at lsn {}: stream {}, batch {} (compaction {}) of sink #{}: {}",
                            g.lsn.0,
                            streams.get(k.stream.0 as usize).map_or_else(|| format!("#{}", k.stream.0), Clone::clone),
                            k.seq.0,
                            k.id,
                            k.sink.0,
                            k.reason.escape_debug()
                        )),
                        _ => {}
                    }
                }
            }
            Scanned::Segment(seg) => {
                let seg = ScannedSegment { groups: Vec::new(), ..*seg };
                segments.push(SegmentLine { seg, groups, lsns, records });
                (groups, lsns, records) = (0, None, 0);
            }
            Scanned::Bytes(_) => unreachable!("not asked for"),
        });
        if verdict.is_err() {
            break;
        }
    }
    // Where the WAL ends is known once every segment was scanned.
    let scanned = recovery.next_read().is_none();
    if verdict.is_ok() {
        verdict = recovery.finish().map(drop);
    }
    let mut tail = None;
    if let Some(last) = skippr_core::format::tail_segment(segments.iter().map(|l| &l.seg)).filter(|_| scanned) {
        let probe = read_at(last.id, last.end, skippr_core::format::TAIL_PROBE_BYTES)?;
        tail = skippr_core::format::tail_unreadable(last, &probe);
    }
    Ok(Walked { verdict, segments, skips, tail })
}

/// `wal verify`'s report of a walk; `name` says where a segment lives.
fn report(walked: Walked, s3: bool, name: impl Fn(SegmentId) -> String) -> i32 {
    match walked.verdict {
        Err(WalDamage::Corrupt(c)) => {
            println!("CORRUPT: {} at byte {}: {}", name(c.segment), c.offset, c.what);
            return exit::WAL_CORRUPT;
        }
        Err(WalDamage::Missing(m)) => {
            println!("MISSING: {}", crate::explain::missing_message(&m, &name));
            return exit::WAL_CORRUPT;
        }
        Ok(()) => {}
    }
    let mut records = 0usize;
    for line in &walked.segments {
        let seg = &line.seg;
        // The segment's file name, or its objects' key prefix.
        let name = match s3 {
            true => name(seg.id),
            false => format!("{:020}.seg", seg.id.0),
        };
        records += line.records;
        match (seg.header_epoch, line.lsns) {
            (None, _) => println!("{name}: header never completed (creation interrupted), no data"),
            (Some(_), Some((first, last))) => println!(
                "{name}: {} groups, lsn {first}..={last}, {} records, {} bytes used{}",
                line.groups,
                line.records,
                seg.end,
                if seg.sealed { ", sealed" } else { "" }
            ),
            (Some(_), None) => println!("{name}: empty (ready for use)"),
        }
    }
    println!("ok: {} segments, {records} records", walked.segments.len());
    // The operator's skips the WAL still holds, each with its place.
    for skip in &walked.skips {
        println!("{skip}");
    }
    if let Some(tail) = walked.tail {
        println!(
            "note: {} ends at byte {} with {}; the daemon stops if its offsets store or a sink holds \
             more than the WAL before them",
            name(tail.segment),
            tail.offset,
            skippr_core::format::UNREADABLE_TAIL
        );
    }
    exit::OK
}

pub fn offsets_show(data_dir: &Path) -> i32 {
    let path = data_dir.join(OFFSETS_FILE);
    if !path.exists() {
        println!("no offsets store at {} (the next run rebuilds it from the WAL)", path.display());
        return exit::OK;
    }
    match read_all(&path) {
        Ok(rows) => {
            for r in &rows {
                println!("{}", r.line());
            }
            println!("{} entries", rows.len());
            exit::OK
        }
        Err(e) => {
            eprintln!("skipprd offsets show: cannot read {}: {e} (is a daemon running on it?)", path.display());
            exit::FAILED
        }
    }
}

pub fn offsets_reset(data_dir: &Path, pipeline: Option<&str>, yes: bool) -> i32 {
    let path = data_dir.join(OFFSETS_FILE);
    if !yes {
        eprintln!(
            "skipprd offsets reset: this forgets the offsets of {} in {}; sources then resume from what the WAL \
             holds. Add --yes to do it.",
            pipeline.map_or("every pipeline".to_string(), |p| format!("pipeline '{p}'")),
            path.display()
        );
        return exit::USAGE;
    }
    match reset(&path, pipeline) {
        Ok(n) => {
            println!("removed {n} offsets entries from {}", path.display());
            exit::OK
        }
        Err(e) => {
            eprintln!("skipprd offsets reset: cannot reset {}: {e} (is a daemon running on it?)", path.display());
            exit::FAILED
        }
    }
}

/// Creates the DynamoDB table for offsets and the writer lease.
pub fn init_table(table: &str, aws: &skippr_io::aws::AwsSettings) -> i32 {
    if let Err(e) = skippr_io::dynamo::check_table_name(table) {
        eprintln!("skipprd offsets init-table: {e}");
        return exit::CONFIG;
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime starts");
    let created = runtime.block_on(async {
        let sdk = aws.load().await?;
        skippr_io::dynamo::Dynamo::create_table(&sdk, table).await
    });
    match created {
        Ok(true) => {
            println!("created the DynamoDB table '{table}'");
            exit::OK
        }
        Ok(false) => {
            println!("the DynamoDB table '{table}' already exists; left as it is");
            exit::OK
        }
        Err(e) => {
            eprintln!("skipprd offsets init-table: {e}");
            exit::REMOTE
        }
    }
}

/// Where `offsets show|reset` look when the offsets are in DynamoDB.
#[derive(clap::Args, Debug)]
/// The settings of `run` that say where offsets are (the WAL they belong
/// to, the store, the AWS endpoints), and the pipeline.
pub struct StoreArgs {
    #[command(flatten)]
    offsets: OffsetsArgs,
    #[command(flatten)]
    table: TableArgs,
    #[command(flatten)]
    wal: WalArgs,
    /// The pipeline whose DynamoDB offsets to show.
    #[arg(long = "of-pipeline", default_value = "main")]
    of_pipeline: String,
    #[command(flatten)]
    aws: AwsArgs,
}

impl StoreArgs {
    /// The DynamoDB table, when that is where the offsets are.
    pub fn table(&self) -> Option<String> {
        let s3 = self.wal.storage() == Ok(WalStorage::S3);
        match self.offsets.offset_store.as_deref() {
            Some("dynamodb") => self.table.dynamodb_table.clone(),
            None if s3 => self.table.dynamodb_table.clone(),
            _ => None,
        }
    }
}

/// `offsets show` (`reset: None`) or `offsets reset --yes` against DynamoDB:
/// the daemon's one source, of `--of-pipeline` (or of the `--pipeline` given
/// to reset).
pub fn dynamo_offsets(table: &str, store: &StoreArgs, data_dir: &Path, reset: Option<(Option<&str>, bool)>) -> i32 {
    let s3 = store.wal.storage() == Ok(WalStorage::S3);
    let identity = match (s3, &store.wal.s3_bucket) {
        (true, Some(bucket)) => skippr_io::dynamo::wal_identity(Some((bucket, &store.wal.prefix())), data_dir),
        (true, None) => {
            eprintln!("skipprd offsets: WAL_STORAGE=s3 needs the WAL's bucket: set SKIPPR_WAL_S3_BUCKET");
            return exit::CONFIG;
        }
        (false, _) => match skippr_io::disk_wal::read_wal_identity(data_dir) {
            Ok(Some(identity)) => identity,
            Ok(None) => skippr_io::dynamo::wal_identity(None, &data_dir.join(WAL_DIR)),
            Err(e) => {
                eprintln!(
                    "skipprd offsets: cannot read {}: {e}",
                    data_dir.join(skippr_io::disk_wal::IDENTITY_FILE).display()
                );
                return exit::DATA_DIR;
            }
        },
    };
    let aws = store.aws.settings();
    let pipeline = reset.and_then(|r| r.0).unwrap_or(&store.of_pipeline).to_string();
    if reset.is_some_and(|(_, yes)| !yes) {
        eprintln!(
            "skipprd offsets reset: this forgets the offsets of pipeline '{pipeline}' of the WAL {identity} in \
             the DynamoDB table '{table}'; sources then resume from what the WAL holds. Add --yes to do it."
        );
        return exit::USAGE;
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime starts");
    let done = runtime.block_on(async {
        let sdk = aws.load().await?;
        let d = skippr_io::dynamo::Dynamo::connect(&sdk, table, &pipeline, vec!["source".into()], &identity).await?;
        if reset.is_some() {
            let n = d.reset().await.map_err(|e| format!("cannot reset: {e:?}"))?;
            println!(
                "removed {n} offsets entries of pipeline '{pipeline}' of the WAL {identity} from the DynamoDB table \
                 '{table}'"
            );
            return Ok(());
        }
        let rows = d.show().await.map_err(|e| format!("cannot read: {e:?}"))?;
        for r in &rows {
            println!("{}", r.line());
        }
        println!("{} entries", rows.len());
        Ok::<_, String>(())
    });
    match done {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("skipprd offsets: {e}");
            exit::REMOTE
        }
    }
}
