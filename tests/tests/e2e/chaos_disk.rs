//! Chaos on a real disk: 25 runs that SIGKILL themselves at seeded moments
//! while records are still in flight, then one clean `--once` run; every
//! generator record must then be in the directory sink exactly once, in
//! order. The record cache is 64 KiB, so compactions read most records back
//! from the WAL while the kills land (S3's chaos runs keep the default).

use skippr_tests::*;
use std::process::Command;

const PARTITIONS: u64 = 3;
const RECORDS: u64 = 300_000;
/// Records a second: 25 runs killed within 0.35 s cannot send the 900,000.
const RATE: u64 = 100_000;

#[test]
fn twenty_five_chaos_runs_all_sigkilled_then_a_clean_run_deliver_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let args = |once: bool| {
        let mut a = vec![
            "run".to_string(),
            "--data-dir".into(),
            data.to_str().unwrap().into(),
            "--generator-partitions".into(),
            PARTITIONS.to_string(),
            "--generator-records".into(),
            RECORDS.to_string(),
            "--generator-rate".into(),
            RATE.to_string(),
            "--wal-bytes-per-file".into(),
            "4194304".into(),
            "--record-cache-bytes".into(),
            "65536".into(),
        ];
        if once {
            a.push("--once".into());
        }
        a
    };
    let work = Work::Paced { rate: RATE, total: PARTITIONS * RECORDS };
    let killed = chaos_runs(25, "0.05", "0.35", work, || {
        let mut c = Command::new(skipprd_bin());
        c.args(args(true));
        c
    });
    assert_eq!(killed, 25, "every run was killed with work in flight");
    let out = Command::new(skipprd_bin()).args(args(true)).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["events"], PARTITIONS, RECORDS);
    let verify = skipprd(&["wal", "verify", data.to_str().unwrap()]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
}
