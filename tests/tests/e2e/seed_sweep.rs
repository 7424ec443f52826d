//! The suite's sweeps: 20,000 seeds of the default scenario, 20,000 in S3
//! mode and 20,000 in clustered mode, a determinism check of each, and the
//! replay of every seed that ever failed (`seeds/`).

use skippr_tests::*;

#[test]
fn twenty_thousand_seeds_pass() {
    let _cores = both_cores();
    let out = skipprd(&["sim", "--seeds", "0..20000", "--jobs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(sweep_summary(&out), (20_000, 0));
}

#[test]
fn twenty_thousand_seeds_pass_in_s3_mode() {
    let _cores = both_cores();
    let out = skipprd(&["sim", "--wal", "s3", "--seeds", "0..20000", "--jobs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(sweep_summary(&out), (20_000, 0));
}

#[test]
fn twenty_thousand_seeds_pass_in_clustered_mode() {
    let _cores = both_cores();
    let out = skipprd(&["sim", "--wal", "clustered", "--seeds", "0..20000", "--jobs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(sweep_summary(&out), (20_000, 0));
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    let _cores = both_cores();
    for wal in ["disk", "s3", "clustered"] {
        let out = skipprd(&["sim", "--wal", wal, "--seeds", "50000..50300", "--jobs", "2", "--check-determinism"]);
        assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
        assert_eq!(sweep_summary(&out), (300, 0));
    }
}

#[test]
fn every_committed_regression_seed_passes() {
    let seeds = repo_root().join("seeds");
    let files = std::fs::read_dir(&seeds)
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "txt")));
    assert!(files.count() > 0, "seeds/ holds the seeds that once failed");
    let out = skipprd(&["sim", "--replay", seeds.to_str().unwrap(), "--check-determinism"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}
