//! Chaos in S3 mode, against the local S3 and DynamoDB server: sixteen runs
//! that SIGKILL themselves at seeded moments (each leaves its lease behind
//! for the next to wait out), then one clean `--once` run; every generator
//! record must then be in the directory sink exactly once, in order.

use skippr_tests::aws;
use skippr_tests::*;
use std::process::Command;

const PARTITIONS: u64 = 3;
const RECORDS: u64 = 20_000;

#[test]
fn sixteen_chaos_runs_all_sigkilled_then_a_clean_run_deliver_exactly_once() {
    let bucket = aws::runtime().block_on(aws::bucket("chaos"));
    let table = format!("chaos-{}", std::process::id());
    let env = aws::env();
    let init = Command::new(skipprd_bin())
        .args(["offsets", "init-table"])
        .env("SKIPPR_OFFSET_DYNAMODB_TABLE", &table)
        .envs(env.clone())
        .output()
        .unwrap();
    assert_eq!(init.status.code(), Some(0), "{}", stderr(&init));
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let run = || {
        let mut c = Command::new(skipprd_bin());
        c.args(["run", "--once", "--data-dir", data.to_str().unwrap()])
            .args(["--generator-partitions", &PARTITIONS.to_string(), "--generator-records", &RECORDS.to_string()])
            .args(["--wal-bytes-per-file", "1048576"])
            .env("WAL_STORAGE", "s3")
            .env("SKIPPR_WAL_S3_BUCKET", &bucket)
            .env("SKIPPR_OFFSET_DYNAMODB_TABLE", &table)
            .env("SKIPPR_LEASE_SECONDS", "0.5")
            .envs(env.clone());
        c
    };
    // At most 2,500 records a second and kills within 1.4 s: the sixteen
    // runs cannot send the 60,000 records between them.
    let paced = || {
        let mut c = run();
        c.args(["--generator-rate", "2500"]);
        c
    };
    let killed = chaos_runs(16, "0.6", "1.4", Work::Paced { rate: 2500, total: PARTITIONS * RECORDS }, paced);
    assert_eq!(killed, 16, "every run was killed with work in flight");
    let out = run().output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["events"], PARTITIONS, RECORDS);
}
