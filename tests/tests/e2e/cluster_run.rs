//! Clustered mode end to end: three `skipprd run` processes on loopback
//! ports with their own DATA_DIRs and one shared directory sink, a finite
//! generator of 200,000 records, and a seeded loop that finds the leader
//! and SIGKILLs it mid-ingest (restarting it each time), then SIGSTOPs a
//! leader past the election timeout and SIGCONTs it. Every record must end
//! in the sink exactly once. Under `--once` every host exits 0 by itself
//! once the run is finished, also when started again after it. The tests
//! of this file run one at a time.

use nix::sys::signal::Signal;
use skippr_tests::cluster::Cluster;
use skippr_tests::*;
use std::process::Command;
use std::time::{Duration, Instant};

const PARTITIONS: u64 = 2;
const RECORDS: u64 = 100_000;

/// A small seeded generator for the moments of the kills (the seed is
/// printed, so a failure's schedule can be run again).
struct Draw(u64);

impl Draw {
    fn millis(&mut self, min: u64, max: u64) -> Duration {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        Duration::from_millis(min + (self.0 >> 33) % (max - min))
    }
}

/// `times` over: `after` a leader is known, SIGKILL it (before the sink
/// holds all `total` records) and start it again.
fn kill_the_leader(cluster: &mut Cluster, times: usize, after: Duration, total: u64) {
    for _ in 0..times {
        let leader = cluster.leader(PATIENCE);
        std::thread::sleep(after);
        assert!(records_in(&cluster.sink) < total, "the ingest ended before the kill");
        cluster.kill(leader);
        std::thread::sleep(Duration::from_millis(300));
        cluster.start(leader);
    }
}

/// Waits (at most 180 s) until the sink holds `total` records.
fn every_record_reaches_the_sink(cluster: &Cluster, total: u64) {
    let until = Instant::now() + Duration::from_secs(180);
    while records_in(&cluster.sink) < total {
        assert!(
            Instant::now() < until,
            "not every record reached the sink: {}",
            cluster.tail(cluster.leader(PATIENCE))
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn records_in(sink: &std::path::Path) -> u64 {
    read_dir_sink(sink).values().map(|v| v.len() as u64).sum()
}

#[test]
fn the_leader_sigkilled_ten_times_and_sigstopped_once_loses_and_duplicates_nothing() {
    let _one = both_cores();
    let seed = std::env::var("SKIPPR_CLUSTER_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    println!("kill schedule seed {seed} (SKIPPR_CLUSTER_TEST_SEED={seed} to run it again)");
    let mut draw = Draw(seed);
    let tmp = tempfile::tempdir().unwrap();
    let records = RECORDS.to_string();
    let partitions = PARTITIONS.to_string();
    let args = [
        "--generator-records",
        &records,
        "--generator-partitions",
        &partitions,
        "--generator-rate",
        "8000",
        "--record-cache-bytes",
        "65536",
    ];
    let mut cluster = Cluster::new(tmp.path(), &args, &[]);
    cluster.start_all();
    let mut kills = 0;
    let started = Instant::now();
    while kills < 10 {
        let leader = cluster.leader(Duration::from_secs(20));
        std::thread::sleep(draw.millis(300, 1500));
        let before = records_in(&cluster.sink);
        assert!(before < PARTITIONS * RECORDS, "the ingest ended before the tenth kill ({kills} so far)");
        cluster.kill(leader);
        kills += 1;
        println!(
            "{:>6.1}s: killed the leader, node {leader}, with {before} records in the sink",
            started.elapsed().as_secs_f64()
        );
        std::thread::sleep(draw.millis(100, 800));
        cluster.start(leader);
    }
    // A leader frozen past the election timeout, then woken: it finds a
    // successor and follows.
    let frozen = cluster.leader(Duration::from_secs(20));
    cluster.signal(frozen, Signal::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    let successor = cluster.leader(Duration::from_secs(20));
    assert_ne!(successor, frozen, "another host leads while node {frozen} is stopped");
    cluster.signal(frozen, Signal::SIGCONT);
    println!("{:>6.1}s: node {frozen} stopped for 3 s; node {successor} took over", started.elapsed().as_secs_f64());
    every_record_reaches_the_sink(&cluster, PARTITIONS * RECORDS);
    // Let a late duplicate show, if one were coming.
    std::thread::sleep(Duration::from_secs(1));
    assert_exactly_once(&cluster.sink, &["events"], PARTITIONS, RECORDS);
    for node in 1..=3 {
        assert_eq!(cluster.stop(node, Duration::from_secs(30)), Some(0), "node {node}: {}", cluster.tail(node));
    }
    assert!(file_contains(&cluster.log(frozen), "following node"), "the woken leader follows");
    committed_prefixes_agree(&cluster, &[1, 2, 3]);
}

/// `wal verify` on each stopped host: the range of committed groups every
/// one holds has one digest on all of them.
fn committed_prefixes_agree(cluster: &Cluster, nodes: &[u64]) {
    let verify = |node: u64, range: &[&str]| {
        let data = cluster.root.join(format!("d{node}"));
        let mut args = vec!["wal", "verify", "--wal-storage", "clustered", data.to_str().unwrap()];
        args.extend(range);
        let out = skipprd(&args);
        assert_eq!(out.status.code(), Some(0), "node {node}: {}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
        stdout(&out)
    };
    let held: Vec<(u64, u64)> = nodes
        .iter()
        .map(|&n| {
            let text = verify(n, &[]);
            let range = text.split("committed groups ").nth(1).and_then(|t| t.split(' ').next()).expect("a range");
            let (a, b) = range.split_once("..=").expect("A..=B");
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect();
    let from = held.iter().map(|h| h.0).max().unwrap().to_string();
    let through = held.iter().map(|h| h.1).min().unwrap().to_string();
    assert!(from.parse::<u64>().unwrap() <= through.parse().unwrap(), "the hosts share committed groups: {held:?}");
    let digests: Vec<String> = nodes
        .iter()
        .map(|&n| {
            let text = verify(n, &["--from", &from, "--through", &through]);
            text.lines().find(|l| l.starts_with("committed prefix")).expect("a digest line").to_string()
        })
        .collect();
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "the hosts' committed prefixes differ: {digests:?}");
    println!("wal verify: {} on nodes {nodes:?}", digests[0]);
}

/// `skipprd cluster status` against host `node`, which must succeed.
fn cluster_status(cluster: &Cluster, node: u64) -> String {
    let port = cluster.metrics_port(node).to_string();
    let out = skipprd(&["cluster", "status", "--metrics-addr", &port]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    stdout(&out)
}

fn metric(cluster: &Cluster, node: u64, name: &str) -> Option<u64> {
    let page = scrape_metrics(cluster.metrics_port(node));
    page.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
}

#[test]
fn a_host_without_a_majority_says_so_and_recovers_when_one_returns() {
    let _one = both_cores();
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--generator-records", "0", "--generator-rate", "2000", "--stall-seconds", "1"];
    let mut cluster = Cluster::new(tmp.path(), &args, &[]);
    cluster.start_all();
    let leader = cluster.leader(PATIENCE);
    let others: Vec<u64> = (1..=3).filter(|n| *n != leader).collect();
    // `cluster status` and the raft metrics, on the leader and a follower.
    wait_until("the leader's status lists both peers", PATIENCE, || {
        let text = cluster_status(&cluster, leader);
        others.iter().all(|p| text.contains(&format!("peer {p}: match index ")))
    });
    let text = cluster_status(&cluster, leader);
    assert!(text.starts_with(&format!("node {leader}: leader, term ")), "{text}");
    let follower = cluster_status(&cluster, others[0]);
    assert!(follower.starts_with(&format!("node {}: follower of node {leader}", others[0])), "{follower}");
    assert!(metric(&cluster, leader, "skippr_raft_commit_index ").is_some_and(|c| c > 0));
    assert_eq!(metric(&cluster, others[0], "skippr_raft_leader "), Some(leader));
    let page = scrape_metrics(cluster.metrics_port(leader));
    for p in &others {
        assert!(page.contains(&format!("skippr_raft_peer_lag{{peer=\"{p}\"}}")), "{page}");
    }
    for n in &others {
        cluster.kill(*n);
    }
    wait_until("the no-majority metric", PATIENCE, || metric(&cluster, leader, "skippr_raft_no_quorum ") == Some(1));
    // Nothing arrives from either: the line says so, not only that no majority is known
    // (at once, or two election timeouts after a peer's last message if one came in
    // after the stall began).
    let said = "no peer has sent this host a message for";
    wait_until("the line naming silence", PATIENCE, || file_contains(&cluster.log(leader), said));
    let held = records_in(&cluster.sink);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(records_in(&cluster.sink), held, "nothing more is delivered without a majority");
    cluster.start(others[0]);
    wait_until("a majority again", PATIENCE, || metric(&cluster, leader, "skippr_raft_no_quorum ") == Some(0));
    assert!(file_contains(&cluster.log(leader), "a raft leader with a majority again"));
    wait_until("records delivered again", PATIENCE, || records_in(&cluster.sink) > held);
    for node in [leader, others[0]] {
        assert_eq!(cluster.stop(node, Duration::from_secs(30)), Some(0), "node {node}: {}", cluster.tail(node));
    }
}

#[test]
fn under_once_every_host_exits_0_by_itself_also_when_started_again() {
    let _one = both_cores();
    let tmp = tempfile::tempdir().unwrap();
    let records = 20_000u64;
    let n = records.to_string();
    let args = ["--once", "--generator-records", &n, "--generator-partitions", "2", "--generator-rate", "8000"];
    let mut cluster = Cluster::new(tmp.path(), &args, &[]);
    cluster.start_all();
    // The leader killed mid-ingest and started again, twice.
    kill_the_leader(&mut cluster, 2, Duration::from_millis(700), 2 * records);
    for node in 1..=3 {
        assert_eq!(cluster.wait(node, Duration::from_secs(90)), Some(0), "node {node}: {}", cluster.tail(node));
    }
    assert_exactly_once(&cluster.sink, &["events"], 2, records);
    for node in 1..=3 {
        assert!(!file_contains(&cluster.log(node), "had not learnt"), "node {node}: {}", cluster.tail(node));
        // Every log line names its host, as three hosts sharing a terminal need.
        let log = std::fs::read_to_string(cluster.log(node)).unwrap();
        let logged: Vec<&str> = log.lines().filter(|l| l.contains(" INFO ") || l.contains(" WARN ")).collect();
        assert!(!logged.is_empty());
        let prefix = format!("[node {node}] ");
        assert!(logged.iter().all(|l| l.starts_with(&prefix)), "node {node}: {}", cluster.tail(node));
    }
    // Started again alone, a host finds the finished run on its own disk.
    cluster.start(2);
    assert_eq!(cluster.wait(2, Duration::from_secs(20)), Some(0), "{}", cluster.tail(2));
    assert_exactly_once(&cluster.sink, &["events"], 2, records);
}

#[test]
fn under_once_a_host_that_missed_the_end_and_finds_no_peer_exits_15_saying_so() {
    let _one = both_cores();
    let tmp = tempfile::tempdir().unwrap();
    let records = 2_000u64;
    let n = records.to_string();
    let args = [
        "--once",
        "--generator-records",
        &n,
        "--generator-partitions",
        "1",
        "--generator-rate",
        "4000",
        "--drain-timeout",
        "2",
    ];
    let mut cluster = Cluster::new(tmp.path(), &args, &[]);
    // Host 3 never runs while two hosts, a majority, finish the run.
    for node in [1, 2] {
        cluster.start(node);
    }
    for node in [1, 2] {
        assert_eq!(cluster.wait(node, Duration::from_secs(90)), Some(0), "node {node}: {}", cluster.tail(node));
    }
    assert_exactly_once(&cluster.sink, &["events"], 1, records);
    // Host 3 has never learnt of the end, and nobody is left to tell it.
    cluster.set_env("SKIPPR_STALL_EXIT_SECONDS", Some("2"));
    cluster.start(3);
    assert_eq!(cluster.wait(3, Duration::from_secs(60)), Some(15), "{}", cluster.tail(3));
    let log = std::fs::read_to_string(cluster.log(3)).unwrap();
    assert!(log.contains("no peer sent this host a single message"), "{}", cluster.tail(3));
    assert!(log.contains("If the other hosts finished this --once run"), "{}", cluster.tail(3));
    assert_exactly_once(&cluster.sink, &["events"], 1, records);
}

#[test]
fn a_follower_whose_data_is_lost_comes_back_under_a_new_id_with_cluster_join() {
    let _one = both_cores();
    let tmp = tempfile::tempdir().unwrap();
    let records = 40_000u64;
    let n = records.to_string();
    let args = ["--generator-records", &n, "--generator-partitions", "2", "--generator-rate", "6000"];
    let mut cluster = Cluster::new(tmp.path(), &args, &[]);
    cluster.start_all();
    let leader = cluster.leader(PATIENCE);
    let lost = (1..=3).find(|n| *n != leader).unwrap();
    let other = (1..=3).find(|n| *n != leader && *n != lost).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    cluster.kill(lost);
    // Its disk, as it was: put back once another host has taken its place.
    let old_disk = tmp.path().join("old-disk");
    let copied = Command::new("cp").arg("-a").arg(tmp.path().join(format!("d{lost}"))).arg(&old_disk).status();
    assert!(copied.unwrap().success());
    std::fs::remove_dir_all(tmp.path().join(format!("d{lost}"))).unwrap();
    // Started on the empty DATA_DIR, it refuses to take part.
    cluster.start(lost);
    assert_eq!(cluster.wait(lost, PATIENCE), Some(3), "{}", cluster.tail(lost));
    assert!(file_contains(&cluster.log(lost), "holds no cluster identity"));
    assert!(!tmp.path().join(format!("d{lost}")).exists(), "a refused start leaves nothing behind");
    // It comes back as node 4; the others learn its address one at a time.
    cluster.join(lost);
    for node in [other, leader] {
        assert_eq!(cluster.stop(node, Duration::from_secs(30)), Some(0), "node {node}: {}", cluster.tail(node));
        cluster.start(node);
    }
    cluster.start(4);
    let join_file = tmp.path().join("d4").join("cluster-join");
    // Waits for the log line too: the log is written by another process,
    // and whether it reached the file when the join file went is not ours to assume.
    wait_until("node 4 a voter (its join file removed, the log saying so)", PATIENCE, || {
        !join_file.exists() && file_contains(&cluster.log(4), "this host is a voter of the cluster")
    });
    every_record_reaches_the_sink(&cluster, 2 * records);
    std::thread::sleep(Duration::from_secs(1));
    assert_exactly_once(&cluster.sink, &["events"], 2, records);
    // The cluster is nodes 4 and the two others now: any two of them lead.
    let status = cluster_status(&cluster, cluster.leader(PATIENCE));
    assert!(status.contains("peer 4: match index "), "{status}");
    assert!(!status.contains(&format!("peer {lost}:")), "node {lost} is removed: {status}");
    // Started again on its old disk, which never heard of its removal, it
    // is told so by the first peer that hears from it, and stops.
    std::fs::rename(&old_disk, tmp.path().join(format!("d{lost}"))).unwrap();
    cluster.start(lost);
    assert_eq!(cluster.wait(lost, PATIENCE), Some(3), "{}", cluster.tail(lost));
    assert!(file_contains(&cluster.log(lost), &format!("says node {lost} was removed")), "{}", cluster.tail(lost));
    for node in [leader, other, 4] {
        assert_eq!(cluster.stop(node, Duration::from_secs(30)), Some(0), "node {node}: {}", cluster.tail(node));
    }
    committed_prefixes_agree(&cluster, &[leader, other, 4]);
}

#[test]
fn a_sigtermed_leader_hands_leadership_over_before_it_exits() {
    let _one = both_cores();
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--generator-records", "0", "--generator-rate", "2000"];
    let mut cluster = Cluster::new(tmp.path(), &args, &[]);
    cluster.start_all();
    let leader = cluster.leader(PATIENCE);
    wait_until("records delivered", PATIENCE, || records_in(&cluster.sink) > 0);
    assert_eq!(cluster.stop(leader, Duration::from_secs(30)), Some(0), "{}", cluster.tail(leader));
    // Without a handover the others would wait out an election timeout
    // (1 s, ten ticks) after the leader's last heartbeat.
    let exited = Instant::now();
    let successor = cluster.leader(PATIENCE);
    let waited = exited.elapsed();
    assert!(waited < Duration::from_millis(500), "node {successor} led {waited:?} after node {leader} exited");
    let held = records_in(&cluster.sink);
    wait_until("records delivered by the successor", PATIENCE, || records_in(&cluster.sink) > held);
    for node in (1..=3).filter(|n| *n != leader) {
        assert_eq!(cluster.stop(node, Duration::from_secs(30)), Some(0), "node {node}: {}", cluster.tail(node));
    }
    // Each host stopped on SIGTERM left a stop record holding raft's log:
    // started again, each restores its log from it without scanning, and
    // the cluster delivers on.
    let logged: Vec<usize> = (1..=3).map(|n| std::fs::read_to_string(cluster.log(n)).map_or(0, |t| t.len())).collect();
    cluster.start_all();
    for node in 1..=3 {
        let from = logged[node as usize - 1];
        let deadline = Instant::now() + PATIENCE;
        let line = loop {
            if let Some(line) = restored_line(&cluster, node, from) {
                break line;
            }
            assert!(Instant::now() < deadline, "node {node} did not restore its log: {}", cluster.tail(node));
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(line.contains("stop_record=\"used\""), "node {node}: {line}");
        // What the checks read: headers, last groups, raft's last group.
        let scanned = restored_field(&cluster, node, from, "scanned_bytes").unwrap();
        assert!(scanned < 64 << 10, "node {node} read {scanned} bytes: {line}");
    }
    let held = records_in(&cluster.sink);
    wait_until("records delivered after the restart", PATIENCE, || records_in(&cluster.sink) > held);
    for node in 1..=3 {
        assert_eq!(cluster.stop(node, Duration::from_secs(30)), Some(0), "node {node}: {}", cluster.tail(node));
    }
}

/// The offsets items of `table` whose key names `identity`, as (key, item).
fn offsets_items(table: &str, identity: &str) -> Vec<String> {
    aws::set_env();
    aws::runtime().block_on(async {
        let sdk = aws::sdk(&aws::endpoint()).await;
        let client = aws_sdk_dynamodb::Client::new(&sdk);
        let page = client.scan().table_name(table).send().await.expect("the local server scans");
        page.items()
            .iter()
            .filter_map(|item| item.get("pk").and_then(|v| v.as_s().ok()).cloned())
            .filter(|pk| pk.starts_with("offsets#") && pk.contains(identity))
            .collect()
    })
}

#[test]
fn with_offsets_in_dynamodb_the_leader_killed_thrice_loses_and_duplicates_nothing() {
    let _one = both_cores();
    let tmp = tempfile::tempdir().unwrap();
    let (_bucket, table) = aws::bucket_and_table("cluster-offsets");
    let mut env: Vec<(&str, String)> = aws::env();
    env.push(("SKIPPR_OFFSET_STORE", "dynamodb".into()));
    env.push(("SKIPPR_OFFSET_DYNAMODB_TABLE", table.clone()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let records = 30_000u64;
    let n = records.to_string();
    let args = ["--generator-records", &n, "--generator-partitions", "2", "--generator-rate", "6000"];
    let mut cluster = Cluster::new(tmp.path(), &args, &env);
    cluster.start_all();
    kill_the_leader(&mut cluster, 3, Duration::from_millis(800), 2 * records);
    every_record_reaches_the_sink(&cluster, 2 * records);
    std::thread::sleep(Duration::from_secs(1));
    assert_exactly_once(&cluster.sink, &["events"], 2, records);
    for node in 1..=3 {
        assert_eq!(cluster.stop(node, Duration::from_secs(30)), Some(0), "node {node}: {}", cluster.tail(node));
    }
    // One store for the cluster, keyed by the cluster's identity, not a host's.
    let identity = format!("cluster://{}/", cluster.id);
    let items = offsets_items(&table, &identity);
    assert_eq!(items.len(), 2, "one offsets item per partition under {identity}: {items:?}");
    committed_prefixes_agree(&cluster, &[1, 2, 3]);
}

/// Answers `hello`, then `retryable` to every batch: a destination that is down.
const DOWN_SINK: &str = "#!/bin/sh\nread hello\necho '{\"type\":\"hello\",\"protocol\":1}'\nwhile read request; do \
                         echo '{\"type\":\"result\",\"outcome\":\"retryable\",\"rows\":0}'; done\n";

/// The last `restored raft's log` line of host `node` since `from` bytes
/// into its log.
fn restored_line(cluster: &Cluster, node: u64, from: usize) -> Option<String> {
    let text = std::fs::read_to_string(cluster.log(node)).unwrap_or_default();
    text.get(from..)?.lines().rfind(|l| l.contains("restored raft's log")).map(str::to_string)
}

/// A field of the last `restored raft's log` line of host `node` since
/// `from` bytes into its log.
fn restored_field(cluster: &Cluster, node: u64, from: usize, name: &str) -> Option<u64> {
    let line = restored_line(cluster, node, from)?;
    let at = line.find(&format!("{name}="))? + name.len() + 1;
    line[at..].split(|c: char| c.is_whitespace()).next()?.parse().ok()
}

/// While a destination is down the hosts commit tens of MiB that no sink
/// takes; killed and started again, each restores raft's log from its own
/// disk holding only a few MiB past its saved commit index in memory. A
/// leader used to save its commit index only with a new term or vote, or
/// before deleting segments: with the sink down it saved none, and a
/// restart held its whole log as uncommitted entries.
#[test]
fn hosts_restarted_after_a_sink_was_down_hold_little_past_their_saved_commit() {
    let _one = both_cores();
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("down-sink.sh");
    std::fs::write(&script, DOWN_SINK).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let args = [
        "--generator-records",
        "400000",
        "--generator-partitions",
        "2",
        "--sink",
        "command",
        "--sink-command",
        script.to_str().unwrap(),
    ];
    let mut cluster = Cluster::new(&tmp.path().join("c"), &args, &[]);
    cluster.start_all();
    let leader = cluster.leader(Duration::from_secs(20));
    // At least 24 MiB of WAL on the leader (4 MiB segments).
    let segments = |node: u64| std::fs::read_dir(cluster.data(node).join("wal")).map_or(0, |d| d.count());
    let deadline = Instant::now() + Duration::from_secs(120);
    while segments(leader) < 7 {
        assert!(Instant::now() < deadline, "the leader's WAL did not grow: {}", cluster.tail(leader));
        std::thread::sleep(Duration::from_millis(100));
    }
    let logged: Vec<usize> = (1..=3).map(|n| std::fs::read_to_string(cluster.log(n)).map_or(0, |t| t.len())).collect();
    for node in 1..=3 {
        cluster.kill(node);
    }
    cluster.start_all();
    for node in 1..=3 {
        let from = logged[node as usize - 1];
        let deadline = Instant::now() + Duration::from_secs(60);
        let held = loop {
            if let Some(held) = restored_field(&cluster, node, from, "uncommitted_bytes") {
                break held;
            }
            assert!(Instant::now() < deadline, "node {node} did not restore its log: {}", cluster.tail(node));
            std::thread::sleep(Duration::from_millis(50));
        };
        let last = restored_field(&cluster, node, from, "last_index").unwrap();
        let commit = restored_field(&cluster, node, from, "commit").unwrap();
        println!("node {node}: commit {commit} of {last}, {held} bytes held past it");
        // A commit index saved at least every 4 MiB of committed entries,
        // and raft's appends in flight (4 messages of at most 1 MiB).
        assert!(held <= 8 << 20, "node {node} (leader: node {leader}) holds {held} bytes past its commit index");
    }
    for node in 1..=3 {
        cluster.kill(node);
    }
}
