//! A WAL that is not whole: a segment deleted by hand (or a backup restored
//! without one) while a sink still needed it. Recovery and `wal verify`
//! stop with exit 5 naming what is missing, before anything is delivered,
//! on disk and in S3 mode.

use skippr_tests::aws;
use skippr_tests::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RECORDS: &str = "20000";

/// Where the WAL lives, and how to point the daemon and the tools at it.
enum Place {
    Disk,
    S3 { bucket: String, table: String },
}

impl Place {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(skipprd_bin());
        c.args(args);
        if let Place::S3 { bucket, table } = self {
            c.env("WAL_STORAGE", "s3")
                .env("SKIPPR_WAL_S3_BUCKET", bucket)
                .env("SKIPPR_OFFSET_DYNAMODB_TABLE", table)
                .env("SKIPPR_LEASE_SECONDS", "2")
                .envs(aws::env());
        }
        c
    }

    /// `skipprd run` with the test sink plugin; `refuse` makes it answer
    /// `retryable` to every batch.
    fn daemon(&self, data: &Path, out: &Path, refuse: bool, once: bool) -> Command {
        let sink = format!("python3 {}", repo_root().join("tests/plugins/sink.py").display());
        let mut c = self.command(&["run", "--data-dir", data.to_str().unwrap()]);
        c.args(["--generator-records", RECORDS, "--wal-bytes-per-file", "1048576", "--drain-timeout", "1"])
            .args(["--sink", "command", "--sink-command", &sink])
            .env("OUT_DIR", out);
        if refuse {
            c.env("REFUSE", "retryable");
        }
        if once {
            c.arg("--once");
        }
        c
    }

    fn verify(&self, data: &Path) -> std::process::Output {
        match self {
            Place::Disk => self.command(&["wal", "verify", data.to_str().unwrap()]).output().unwrap(),
            Place::S3 { .. } => self.command(&["wal", "verify"]).output().unwrap(),
        }
    }

    fn segments(&self, data: &Path) -> Vec<u64> {
        match self {
            Place::Disk => {
                let mut ids: Vec<u64> = std::fs::read_dir(data.join("wal"))
                    .unwrap()
                    .filter_map(|e| e.unwrap().file_name().to_str()?.strip_suffix(".seg")?.parse().ok())
                    .collect();
                ids.sort();
                ids
            }
            Place::S3 { bucket, .. } => aws::runtime().block_on(async {
                let client = s3_client().await;
                let listed = client.list_objects_v2().bucket(bucket).prefix("skipprd/wal/").send().await.unwrap();
                let mut ids: Vec<u64> = listed
                    .contents()
                    .iter()
                    .filter_map(|o| o.key()?.strip_prefix("skipprd/wal/")?.split('/').next()?.parse().ok())
                    .collect();
                ids.dedup();
                ids
            }),
        }
    }

    fn delete(&self, data: &Path, segment: u64) {
        match self {
            Place::Disk => std::fs::remove_file(data.join("wal").join(format!("{segment:020}.seg"))).unwrap(),
            Place::S3 { bucket, .. } => aws::runtime().block_on(async {
                let client = s3_client().await;
                let prefix = format!("skipprd/wal/{segment:020}/");
                let listed = client.list_objects_v2().bucket(bucket).prefix(&prefix).send().await.unwrap();
                for o in listed.contents() {
                    client.delete_object().bucket(bucket).key(o.key().unwrap()).send().await.unwrap();
                }
            }),
        }
    }
}

struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn s3_client() -> aws_sdk_s3::Client {
    let sdk = aws::sdk(&aws::endpoint()).await;
    aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true).build())
}

/// Runs the pipeline into a sink that refuses every batch until the WAL
/// holds every record (so nothing was compacted and every segment is still
/// needed), then stops it. Returns the segments that hold data.
fn fill_uncompacted_wal(place: &Place, data: &Path, out: &Path) -> Vec<u64> {
    let child = place.daemon(data, out, true, false).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // Killed if the test fails before it is stopped.
    let mut child = KillOnDrop(Some(child));
    let deadline = Instant::now() + Duration::from_secs(120);
    let all = format!(" segments, {} records", 2 * RECORDS.parse::<u64>().unwrap());
    loop {
        let verify = stdout(&place.verify(data));
        if verify.lines().any(|l| l.starts_with("ok: ") && l.ends_with(&all)) {
            break;
        }
        assert!(Instant::now() < deadline, "the WAL never held every record: {verify}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut child = child.0.take().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(9), "a sink that refuses everything cannot be drained");
    let segments = place.segments(data);
    assert!(segments.len() >= 4, "the records fill several segments: {segments:?}");
    segments
}

/// Deletes one segment, then checks that `wal verify` and a run with a
/// working sink both stop with exit 5 naming `expect`, and that nothing
/// reached the sink.
fn lose_and_expect_stop(place: &Place, which: fn(&[u64]) -> u64, expect: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let (data, out) = (tmp.path().join("data"), tmp.path().join("out"));
    let segments = fill_uncompacted_wal(place, &data, &out);
    let lost = which(&segments);
    place.delete(&data, lost);

    let verify = place.verify(&data);
    let text = stdout(&verify);
    assert_eq!(verify.status.code(), Some(5), "wal verify: {text}{}", stderr(&verify));
    assert!(text.contains("MISSING: the WAL is not whole"), "{text}");
    let run = place.daemon(&data, &out, false, true).output().unwrap();
    let log = stderr(&run);
    assert_eq!(run.status.code(), Some(5), "{log}");
    for needle in expect.iter().map(|e| e.replace("{lost}", &format!("{lost:020}"))) {
        assert!(text.contains(&needle), "wal verify names {needle}: {text}");
        assert!(log.contains(&needle), "the daemon names {needle}: {log}");
    }
    assert!(read_dir_sink(&out).is_empty(), "nothing was delivered from a WAL that is not whole");
}

fn oldest(s: &[u64]) -> u64 {
    s[0]
}

fn middle(s: &[u64]) -> u64 {
    s[s.len() / 2]
}

const OLDEST: &[&str] = &["segments before it were still needed", "sink 'sink'", "acknowledged", "below position 0"];
const MIDDLE: &[&str] = &["is missing", "{lost}", "LSNs "];

#[test]
fn a_lost_oldest_segment_stops_recovery_on_disk() {
    lose_and_expect_stop(&Place::Disk, oldest, OLDEST);
}

#[test]
fn a_lost_middle_segment_stops_recovery_on_disk() {
    lose_and_expect_stop(&Place::Disk, middle, MIDDLE);
}

fn s3_place(name: &str) -> Place {
    let (bucket, table) = aws::bucket_and_table(name);
    Place::S3 { bucket, table }
}

#[test]
fn a_lost_oldest_segment_stops_recovery_in_s3_mode() {
    lose_and_expect_stop(&s3_place("lost-oldest"), oldest, OLDEST);
}

#[test]
fn a_lost_middle_segment_stops_recovery_in_s3_mode() {
    lose_and_expect_stop(&s3_place("lost-middle"), middle, MIDDLE);
}

/// A run into the directory sink that finishes, for the tests below.
fn run_dir(data: &Path, records: &str) -> std::process::Output {
    let mut cmd = Command::new(skipprd_bin());
    cmd.args(["run", "--once", "--data-dir", data.to_str().unwrap(), "--generator-records", records])
        .args(["--wal-bytes-per-file", "1048576"]);
    output_within(&mut cmd, PATIENCE)
}

#[test]
fn an_older_copy_of_the_wal_restored_is_caught_by_the_offsets_store() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    assert_eq!(run_dir(&data, "5000").status.code(), Some(0));
    let copy = tmp.path().join("wal-backup");
    std::fs::create_dir_all(&copy).unwrap();
    for e in std::fs::read_dir(data.join("wal")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
    }
    // More records after the backup; then the backup is restored over the
    // WAL, without the offsets store.
    assert_eq!(run_dir(&data, "15000").status.code(), Some(0));
    std::fs::remove_dir_all(data.join("wal")).unwrap();
    std::fs::rename(&copy, data.join("wal")).unwrap();
    let out = run_dir(&data, "15000");
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("committed WAL data is missing"), "{}", stderr(&out));
}

#[test]
fn a_lost_newest_segment_is_caught_by_the_offsets_store_or_the_head_check() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    assert_eq!(run_dir(&data, "20000").status.code(), Some(0));
    let mut ids = Place::Disk.segments(&data);
    // The newest segment with data, and the spare after it, if any.
    let verify = stdout(&Place::Disk.verify(&data));
    ids.retain(|id| verify.contains(&format!("{id:020}.seg: ")) && !verify.contains(&format!("{id:020}.seg: empty")));
    let newest = *ids.last().unwrap();
    for id in Place::Disk.segments(&data).into_iter().filter(|id| *id >= newest) {
        Place::Disk.delete(&data, id);
    }
    let sink_before = read_dir_sink(&data.join("sink"));
    let out = run_dir(&data, "20000");
    let log = stderr(&out);
    // Caught either way: by the offsets store (ahead of the shortened WAL),
    // or, when the lost segment held the acknowledgements that justified
    // deleting older segments, by the WAL's own head check.
    match out.status.code() {
        Some(6) => assert!(log.contains("committed WAL data is missing"), "{log}"),
        Some(5) => assert!(log.contains("the WAL is not whole"), "{log}"),
        other => panic!("a lost newest segment went unnoticed ({other:?}): {log}"),
    }
    assert_eq!(read_dir_sink(&data.join("sink")), sink_before, "nothing more was delivered");
}

#[test]
fn a_whole_data_directory_restored_from_an_older_backup_is_caught_by_the_sink() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, sink, backup) = (tmp.path().join("data"), tmp.path().join("sink"), tmp.path().join("backup"));
    let run = |records: &str| {
        let mut cmd = Command::new(skipprd_bin());
        cmd.args(["run", "--once", "--data-dir", data.to_str().unwrap(), "--generator-records", records])
            .args(["--sink-dir", sink.to_str().unwrap()]);
        output_within(&mut cmd, PATIENCE)
    };
    assert_eq!(run("5000").status.code(), Some(0));
    assert!(Command::new("cp").arg("-a").arg(&data).arg(&backup).status().unwrap().success());
    assert_eq!(run("15000").status.code(), Some(0));
    // WAL and offsets store together, from before the second run; the sink
    // (elsewhere) holds the batches of both runs.
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::rename(&backup, &data).unwrap();
    let out = run("15000");
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(6), "{log}");
    assert!(log.contains("the WAL is older than what the sink holds"), "{log}");
    assert_exactly_once(&sink, &["events"], 2, 15000);
}
