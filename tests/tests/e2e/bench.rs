//! `skipprd bench wal` and `bench e2e` run their rounds and refuse tmpfs.

use skippr_tests::*;

#[test]
fn bench_wal_prints_rounds_and_a_median_ratio() {
    let tmp = tempfile::tempdir_in(repo_root()).unwrap();
    let out = skipprd(&["bench", "wal", "--dir", tmp.path().to_str().unwrap(), "--rounds", "3", "--commits", "20"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("file system: "), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("round ")).count(), 3, "{text}");
    let median = text.lines().find(|l| l.starts_with("median: ")).expect("a median line");
    let ratio: f64 = median.rsplit("ratio ").next().unwrap().parse().unwrap();
    assert!(ratio > 0.0, "{median}");
}

#[test]
fn bench_wal_refuses_tmpfs() {
    if !std::path::Path::new("/dev/shm").exists() {
        panic!("this machine has no /dev/shm tmpfs to test the refusal on");
    }
    let out = skipprd(&["bench", "wal", "--dir", "/dev/shm/skipprd-bench-refusal"]);
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    assert!(stderr(&out).contains("tmpfs"), "{}", stderr(&out));
}

#[test]
fn bench_e2e_runs_the_pipeline_the_plain_program_and_a_baseline_side_by_side() {
    let tmp = tempfile::tempdir_in(repo_root()).unwrap();
    let me = skipprd_bin();
    let args = ["bench", "e2e", "--dir", tmp.path().to_str().unwrap(), "--rounds", "2", "--records", "20000"];
    let out = skipprd(&[&args[..], &["--baseline", me.to_str().unwrap()]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let rounds: Vec<&str> = text.lines().filter(|l| l.starts_with("round ")).collect();
    assert_eq!(rounds.len(), 2, "{text}");
    assert!(
        rounds.iter().all(|r| r.contains("commits") && r.contains("sink files") && r.contains("baseline")),
        "{text}"
    );
    let median = text.lines().find(|l| l.starts_with("median: ")).expect("a median line");
    let ratio: f64 = median.split("ratio ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
    assert!(ratio > 0.0, "{median}");
    assert!(median.contains("pipeline/baseline"), "{median}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "every round cleans up after itself: {left:?}");
    let shm = skipprd(&["bench", "e2e", "--dir", "/dev/shm/skipprd-bench-refusal"]);
    assert_eq!(shm.status.code(), Some(3), "{}", stdout(&shm));
}

#[test]
fn bench_recovery_restarts_a_full_wal_after_a_crash_and_after_a_clean_stop() {
    let tmp = tempfile::tempdir_in(repo_root()).unwrap();
    let out = skipprd(&["bench", "recovery", "--dir", tmp.path().to_str().unwrap(), "--sizes", "128", "--rounds", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let medians: Vec<&str> = text.lines().filter(|l| l.contains(", median: ")).collect();
    assert_eq!(medians.len(), 2, "one per kind of stop: {text}");
    for kind in ["after a crash", "after a clean stop"] {
        let round = text.lines().find(|l| l.contains(kind) && l.contains("round 0")).expect(kind);
        let rss: f64 = round.split("peak RSS ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        assert!(rss > 1.0, "{round}");
        assert!(!round.contains("recovered after ?"), "the recovered line is seen: {round}");
        assert!(round.contains("MB/s cold"), "{round}");
    }
    let shm = skipprd(&["bench", "recovery", "--dir", "/dev/shm/skipprd-bench-refusal"]);
    assert_eq!(shm.status.code(), Some(3), "{}", stdout(&shm));
}
