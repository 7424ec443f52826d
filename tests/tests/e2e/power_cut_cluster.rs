//! Power cuts in clustered mode (issue #29): three hosts, each with its
//! DATA_DIR on a file system of its own that forgets what was not synced
//! (`skippr_tests::forgetfs`), the suite's acknowledging source
//! (`tests/plugins/source.py` with `ACK_LOG`, which never sends below what
//! it was acknowledged) paced so that the cuts land mid-ingest, and one
//! directory sink on the ordinary disk. A seeded schedule cuts the leader,
//! a follower, or both at once (each host SIGKILLed, its mount cut and
//! mounted again, `wal verify` clean on what is left, the host started
//! again), then all three, after which the hosts run unpaced to the end of
//! the input. Every acknowledged record and every record at all must be in
//! the sink exactly once. With the hard-state slot written unsynced (a
//! fault planted in the driver), the loop must fail.

use skippr_tests::cluster::Cluster;
use skippr_tests::forgetfs::mount::Mount;
use skippr_tests::*;
use std::path::Path;
use std::time::{Duration, Instant};

const PARTITIONS: u64 = 2;
const RECORDS: u64 = 100_000;
/// Records a second the source sends at most while the cuts go on: the
/// 200,000 records take 133 s, and the cuts must all come before.
const RATE: u64 = 1_500;

/// A small seeded generator for the schedule (the seed is printed).
struct Draw(u64);

impl Draw {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

/// The sequence number of the last save in the hard-state file of the
/// DATA_DIR `data`, as a reader sees it now.
fn saves(data: &Path) -> u64 {
    let file = std::fs::read(data.join(skippr_io::hard_state_file::FILE_NAME)).unwrap_or_default();
    match skippr_core::cluster::decode_file(&file) {
        Ok(Some(saved)) => saved.seq,
        _ => 0,
    }
}

/// What host `n` said last of note: a panic's message with the line that
/// names it, the error it stopped with, or its log's last lines.
fn why(cluster: &Cluster, n: u64) -> String {
    let log = std::fs::read_to_string(cluster.log(n)).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    if let Some(at) = lines.iter().position(|l| l.contains("panicked at")) {
        return lines[at..(at + 2).min(lines.len())].join(" ");
    }
    match lines.iter().rev().find(|l| l.contains("skipprd run:")) {
        Some(line) => line.to_string(),
        None => cluster.tail(n),
    }
}

fn records_in(sink: &Path) -> u64 {
    read_dir_sink(sink).values().map(|v| v.len() as u64).sum()
}

#[derive(Debug, Default)]
struct Cuts {
    leader: u64,
    follower: u64,
    two_at_once: u64,
    all_three: u64,
    /// Files and directories a cut took back to an older state, in all.
    reverted: u64,
}

/// `rounds` rounds of the schedule drawn from `seed`, then all three hosts
/// cut and the input run to its end; with `planted` armed on every host.
/// The cuts made, or the first thing that broke.
fn cluster_power_cuts(rounds: u64, seed: u64, planted: Option<&str>) -> Result<Cuts, String> {
    Mount::available()?;
    let tmp = tempfile::tempdir().unwrap();
    let mut mounts: Vec<Mount> = (1..=3)
        .map(|n| {
            let dir = tmp.path().join(format!("m{n}"));
            std::fs::create_dir(&dir).unwrap();
            Mount::new(&dir).unwrap()
        })
        .collect();
    let data: Vec<_> = mounts.iter().map(|m| m.path().join("data")).collect();
    let acks = tmp.path().join("acked");
    let source = format!("python3 {}", repo_root().join("tests/plugins/source.py").display());
    let args = ["--once", "--source", "command", "--source-command", &source];
    let (records, partitions, rate) = (RECORDS.to_string(), PARTITIONS.to_string(), RATE.to_string());
    let mut env = vec![
        ("STREAM", "events"),
        ("PARTITIONS", &partitions),
        ("RECORDS", &records),
        ("RATE", &rate),
        ("ACK_LOG", acks.to_str().unwrap()),
    ];
    if let Some(fault) = planted {
        env.push(("SKIPPR_PLANTED_DRIVER_FAULTS", fault));
    }
    let mut cluster = Cluster::with_data_dirs(tmp.path(), &data, &args, &env);
    cluster.start_all();
    let total = PARTITIONS * RECORDS;
    let mut cuts = Cuts::default();
    let mut draw = Draw(seed);
    let started = Instant::now();
    let cut = |cluster: &mut Cluster, mounts: &mut [Mount], nodes: &[u64], cuts: &mut Cuts| {
        for &n in nodes {
            cluster.kill(n);
        }
        for &n in nodes {
            let written = saves(cluster.data(n));
            let c = mounts[n as usize - 1].cut().map_err(|e| format!("cutting node {n}'s mount: {e}"))?;
            cuts.reverted += c.files_reverted + c.dirs_reverted;
            // Each save goes to the slot the last one did not use, and is
            // synced before the next is written: a cut may take back the
            // one being written at the kill, never the one before it.
            let kept = saves(cluster.data(n));
            if kept + 1 < written {
                return Err(format!(
                    "node {n}'s hard state went back from save {written} to save {kept} at its cut: \
                     a save was not synced"
                ));
            }
            let out = skipprd(&["wal", "verify", "--wal-storage", "clustered", cluster.data(n).to_str().unwrap()]);
            if out.status.code() != Some(0) {
                return Err(format!("wal verify on node {n} after its cut: {}{}", stdout(&out), stderr(&out)));
            }
        }
        Ok::<(), String>(())
    };
    for round in 0..rounds {
        for n in 1..=3 {
            if let Some(code) = cluster.exited(n) {
                return Err(format!("node {n} exited with {code:?} before round {round}: {}", why(&cluster, n)));
            }
        }
        let leader = cluster.leader(PATIENCE);
        std::thread::sleep(Duration::from_millis(200 + draw.next(800)));
        let before = records_in(&cluster.sink);
        if before >= total {
            return Err(format!("the ingest ended before round {round}: no cut can land mid-ingest"));
        }
        let follower = [1, 2, 3].into_iter().filter(|n| *n != leader).nth(draw.next(2) as usize).unwrap();
        let nodes = match round % 3 {
            0 => {
                cuts.leader += 1;
                vec![leader]
            }
            1 => {
                cuts.follower += 1;
                vec![follower]
            }
            _ => {
                cuts.two_at_once += 1;
                vec![leader, follower]
            }
        };
        cut(&mut cluster, &mut mounts, &nodes, &mut cuts)?;
        println!(
            "{:>6.1}s: cut {nodes:?} (leader {leader}) with {before} records in the sink",
            started.elapsed().as_secs_f64()
        );
        for n in nodes {
            cluster.start(n);
        }
    }
    // The whole cluster's power, mid-ingest; then the rest unpaced.
    let before = records_in(&cluster.sink);
    if before >= total {
        return Err("the ingest ended before the last cut".into());
    }
    cut(&mut cluster, &mut mounts, &[1, 2, 3], &mut cuts)?;
    cuts.all_three += 1;
    println!("{:>6.1}s: cut all three with {before} records in the sink", started.elapsed().as_secs_f64());
    cluster.set_env("RATE", None);
    cluster.start_all();
    // Each host exits 0 by itself once the input is done; the first that
    // does not ends the loop.
    let (mut running, until) = (vec![1, 2, 3], Instant::now() + Duration::from_secs(300));
    while !running.is_empty() {
        if Instant::now() > until {
            return Err(format!("nodes {running:?} still ran 300 s after the last cut: {}", cluster.tail(running[0])));
        }
        for n in running.clone() {
            match cluster.exited(n) {
                None => {}
                Some(Some(0)) => running.retain(|r| *r != n),
                Some(code) => return Err(format!("node {n} ended with {code:?}: {}", why(&cluster, n))),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let lost = lost_acknowledgements(&acks, &cluster.sink, "events");
    if !lost.is_empty() {
        return Err(format!("acknowledgements lost: {}", lost.join("; ")));
    }
    std::panic::catch_unwind(|| assert_exactly_once(&cluster.sink, &["events"], PARTITIONS, RECORDS))
        .map_err(|e| format!("the sink: {:?}", e.downcast_ref::<String>()))?;
    Ok(cuts)
}

#[test]
fn power_cuts_of_the_leader_a_follower_two_and_all_three_hosts_lose_and_duplicate_nothing() {
    let _one = both_cores();
    let seed = std::env::var("SKIPPR_POWER_CUT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    println!("schedule seed {seed} (SKIPPR_POWER_CUT_SEED={seed} to run it again)");
    let cuts = cluster_power_cuts(9, seed, None).unwrap();
    println!("{cuts:?}");
    assert_eq!((cuts.leader, cuts.follower, cuts.two_at_once, cuts.all_three), (3, 3, 3, 1));
    // The hosts' files hold nothing unsynced at a kill (each step of a
    // `Ready` is synced before the next), so a correct cluster leaves the
    // cuts nothing to drop: that the cuts bite is shown by the planted
    // fault below.
}

#[test]
fn a_hard_state_slot_written_without_a_sync_is_caught_by_the_clustered_power_cut_loop() {
    let _one = both_cores();
    let caught = std::panic::catch_unwind(|| cluster_power_cuts(9, 1, Some("hard-state-unsynced")));
    let why = match caught {
        Ok(Ok(cuts)) => panic!("hard-state-unsynced went unnoticed through {cuts:?}"),
        Ok(Err(why)) => why,
        Err(panic) => panic.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    // Caught by what the loop checks at a cut, not by any failure at all (a
    // file system that cannot be mounted, a wait that timed out).
    assert!(why.contains("a save was not synced"), "hard-state-unsynced was not caught by the save check: {why}");
    println!("hard-state-unsynced: caught: {why}");
}
