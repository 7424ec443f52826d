//! `skipprd bench wal` runs both loops and refuses tmpfs.

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
