//! The S3 sink against the local S3 server `./test.sh` starts: one object
//! per batch under its sequence number, created only if absent; a put whose
//! answer is lost resolves to `already_applied`; another batch under a
//! taken number is `fatal`; chaos runs with real SIGKILLs end with every
//! record in the bucket exactly once, plain and gzipped.

use skippr_core::ledger::Scope;
use skippr_core::{CompactionId, Records, SinkOutcome};
use skippr_io::plugin::s3_sink::{S3Sink, S3SinkTarget, ID_METADATA};
use skippr_io::plugin::Sink;
use skippr_tests::aws::{self, Proxy};
use skippr_tests::*;
use std::collections::BTreeMap;
use std::io::Read;
use std::process::Command;
use std::sync::atomic::Ordering;

fn client() -> aws_sdk_s3::Client {
    let sdk = aws::runtime().block_on(aws::sdk(&aws::endpoint()));
    aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true).build())
}

/// Every object under `prefix`: key, body (gunzipped when it ends in .gz)
/// and the compaction id in its metadata.
pub(crate) fn objects(bucket: &str, prefix: &str) -> Vec<(String, Vec<u8>, String)> {
    let rt = aws::runtime();
    let c = client();
    rt.block_on(async {
        let mut out = Vec::new();
        let mut pages = c.list_objects_v2().bucket(bucket).prefix(prefix).into_paginator().send();
        while let Some(page) = pages.next().await {
            for o in page.unwrap().contents() {
                let key = o.key().unwrap().to_string();
                let got = c.get_object().bucket(bucket).key(&key).send().await.unwrap();
                let id = got.metadata().and_then(|m| m.get(ID_METADATA)).cloned().unwrap_or_default();
                let mut body = got.body.collect().await.unwrap().into_bytes().to_vec();
                if key.ends_with(".gz") {
                    let mut plain = Vec::new();
                    flate2::read::GzDecoder::new(&body[..]).read_to_end(&mut plain).unwrap();
                    body = plain;
                }
                out.push((key, body, id));
            }
        }
        out
    })
}

/// Every generator record of `stream` once, in source order per partition,
/// reading the objects in sequence order; the keys dense from 0.
fn assert_exactly_once_in_bucket(bucket: &str, prefix: &str, stream: &str, partitions: u64, records: u64) {
    let objs = objects(bucket, &format!("{prefix}{stream}/"));
    let mut next: BTreeMap<u64, u64> = (0..partitions).map(|p| (p, 0)).collect();
    for (i, (key, body, id)) in objs.iter().enumerate() {
        let name = key.rsplit('/').next().unwrap();
        let tag = objs[0].0.rsplit('/').next().unwrap().split('.').next().unwrap();
        assert!(tag.starts_with("main-"), "{key}: the pipeline's tag first");
        assert_eq!(
            name.split('.').nth(1).unwrap(),
            format!("{i:020}"),
            "{key}: one tag, sequence numbers dense from 0"
        );
        assert_eq!(id.len(), 16, "{key} carries its compaction id: {id:?}");
        for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).unwrap();
            let (p, seq) = (v["partition"].as_u64().unwrap(), v["seq"].as_u64().unwrap());
            let want = next.get_mut(&p).unwrap_or_else(|| panic!("partition {p} unexpected"));
            assert_eq!(seq, *want, "partition {p}: seq {seq} where {want} was due (repeated or out of order) in {key}");
            *want += 1;
        }
    }
    for (p, n) in next {
        assert_eq!(n, records, "partition {p}: {n} of {records} records");
    }
}

fn daemon(data: &std::path::Path, bucket: &str, prefix: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(skipprd_bin());
    c.args(["run", "--data-dir", data.to_str().unwrap(), "--sink", "s3", "--sink-s3-bucket", bucket])
        .args(["--sink-s3-prefix", prefix])
        .args(extra)
        .envs(aws::env());
    c
}

fn batch(n: u64) -> Records {
    let lines: Vec<Vec<u8>> = (0..3).map(|i| format!("{{\"batch\":{n},\"i\":{i}}}").into_bytes()).collect();
    lines.iter().map(|l| &l[..]).collect()
}

#[test]
fn a_lost_answer_resolves_to_already_applied_and_another_batch_under_a_taken_number_is_fatal() {
    let bucket = aws::runtime().block_on(aws::bucket("s3sink"));
    let proxy = Proxy::start(&aws::endpoint());
    let rt = aws::runtime();
    let sdk = rt.block_on(aws::sdk(&format!("http://127.0.0.1:{}", proxy.port)));
    for gzip in [false, true] {
        let prefix = format!("replay-{gzip}/");
        let target = rt.block_on(S3SinkTarget::connect(&sdk, &bucket, &prefix, gzip)).unwrap();
        let scope = Scope::new("main", "disk://test/wal/");
        let mut sink = S3Sink::new(target, &scope, rt.handle().clone());
        assert_eq!(sink.apply("s", 0, CompactionId(7), &batch(0)).unwrap(), SinkOutcome::Applied);
        // The object is created; its answer never arrives.
        proxy.drop_responses.store(true, Ordering::SeqCst);
        assert!(sink.apply("s", 1, CompactionId(8), &batch(1)).is_err(), "an unknown outcome is retried");
        proxy.drop_responses.store(false, Ordering::SeqCst);
        assert_eq!(sink.apply("s", 1, CompactionId(8), &batch(1)).unwrap(), SinkOutcome::AlreadyApplied);
        // Another id, or other records, under a taken number.
        assert_eq!(sink.apply("s", 1, CompactionId(9), &batch(1)).unwrap(), SinkOutcome::Fatal);
        assert_eq!(sink.apply("s", 1, CompactionId(8), &batch(2)).unwrap(), SinkOutcome::Fatal);
        assert_eq!(sink.progress(&["s".into(), "t".into()]).unwrap(), vec![("s".to_string(), 1)]);
        let objs = objects(&bucket, &prefix);
        let ext = if gzip { "jsonl.gz" } else { "jsonl" };
        let keys: Vec<_> = objs.iter().map(|o| o.0.clone()).collect();
        assert_eq!(keys, [0, 1].map(|n| format!("{prefix}s/{}.{n:020}.{ext}", scope.tag())));
        assert_eq!(objs[1].1, b"{\"batch\":1,\"i\":0}\n{\"batch\":1,\"i\":1}\n{\"batch\":1,\"i\":2}\n");
        assert_eq!(objs[1].2, CompactionId(8).to_string());
    }
    assert!(proxy.dropped.load(Ordering::SeqCst) >= 2, "the proxy dropped the answers");
}

#[test]
fn a_slow_answer_to_the_start_up_check_is_asked_again() {
    let bucket = aws::runtime().block_on(aws::bucket("s3sinkslow"));
    let proxy = Proxy::start(&aws::endpoint());
    let rt = aws::runtime();
    aws::set_env();
    // Requests given 300 ms (as a short S3-mode lease gives them); the
    // first answer comes after a second.
    let settings = skippr_io::aws::AwsSettings {
        region: Some("us-east-1".into()),
        endpoint: Some(proxy.endpoint()),
        operation_timeout: Some(std::time::Duration::from_millis(300)),
    };
    let sdk = rt.block_on(settings.load()).unwrap();
    proxy.slow_next.store(1, Ordering::SeqCst);
    let target = rt.block_on(S3SinkTarget::connect(&sdk, &bucket, "slow/", false));
    assert!(target.is_ok(), "{:?}", target.err());
    assert_eq!(proxy.slow_next.load(Ordering::SeqCst), 0, "the first answer was held back");
}

#[test]
fn chaos_runs_sigkilled_mid_ingest_then_every_record_is_in_the_bucket_exactly_once() {
    let bucket = aws::runtime().block_on(aws::bucket("s3sink-chaos"));
    for (gzip, prefix) in [("false", "plain/"), ("true", "gz/")] {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let args = ["--once", "--generator-records", "30000", "--sink-s3-gzip", gzip];
        // 10,000 records a second at most, and kills within 0.5 s: the ten
        // runs cannot send the 60,000 records between them.
        let killed = chaos_runs(10, "0.2", "0.5", Work::Paced { rate: 10_000, total: 60_000 }, || {
            let mut c = daemon(&data, &bucket, prefix, &args);
            c.args(["--generator-rate", "10000"]);
            c
        });
        assert_eq!(killed, 10, "every run was killed with work in flight");
        let out = daemon(&data, &bucket, prefix, &args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_exactly_once_in_bucket(&bucket, prefix, "events", 2, 30_000);
    }
}

#[test]
fn a_missing_bucket_stops_start_up_with_exit_thirteen_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let out = daemon(&tmp.path().join("d"), "no-such-bucket-here", "", &["--once"]).output().unwrap();
    assert_eq!(out.status.code(), Some(13), "{}", stderr(&out));
    assert!(stderr(&out).contains("'no-such-bucket-here' does not exist"), "{}", stderr(&out));
    let out = Command::new(skipprd_bin())
        .args(["run", "--once", "--sink", "s3", "--data-dir", tmp.path().join("d2").to_str().unwrap()])
        .env_remove("SKIPPR_SINK_S3_BUCKET")
        .envs(aws::env())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("--sink-s3-bucket"), "{}", stderr(&out));
}

/// Objects as the sink wrote them before keys carried a pipeline tag
/// (`<prefix><stream>/<seq>.jsonl`, the id in the metadata): the first
/// pipeline to find them owns them, counts them in its progress and answers
/// a replay of one `already_applied`; another pipeline has its own numbers.
#[test]
fn objects_of_before_pipeline_tags_belong_to_the_first_pipeline_to_find_them() {
    let rt = aws::runtime();
    let bucket = rt.block_on(aws::bucket("s3sink-upgrade"));
    let sdk = rt.block_on(aws::sdk(&aws::endpoint()));
    let c = client();
    rt.block_on(async {
        for seq in 0..2u64 {
            let body = skippr_io::plugin::json_lines(&batch(seq));
            c.put_object()
                .bucket(&bucket)
                .key(format!("old/s/{seq:020}.jsonl"))
                .metadata(ID_METADATA, CompactionId(70 + seq).to_string())
                .body(body.into())
                .send()
                .await
                .unwrap();
        }
    });
    let target = rt.block_on(S3SinkTarget::connect(&sdk, &bucket, "old/", false)).unwrap();
    let (main, second) = (Scope::new("main", "disk://test/wal/"), Scope::new("second", "disk://test/wal/"));
    let mut sink = S3Sink::new(target.clone(), &main, rt.handle().clone());
    assert_eq!(sink.progress(&["s".into()]).unwrap(), vec![("s".to_string(), 1)]);
    assert_eq!(sink.apply("s", 1, CompactionId(71), &batch(1)).unwrap(), SinkOutcome::AlreadyApplied);
    assert_eq!(sink.apply("s", 1, CompactionId(99), &batch(1)).unwrap(), SinkOutcome::Fatal);
    assert_eq!(sink.apply("s", 1, CompactionId(71), &batch(5)).unwrap(), SinkOutcome::Fatal);
    assert_eq!(sink.apply("s", 2, CompactionId(72), &batch(2)).unwrap(), SinkOutcome::Applied);
    let mut other = S3Sink::new(target.clone(), &second, rt.handle().clone());
    assert!(other.progress(&["s".into()]).unwrap().is_empty(), "the old objects are main's");
    assert_eq!(other.apply("s", 0, CompactionId(80), &batch(0)).unwrap(), SinkOutcome::Applied);
    let mut again = S3Sink::new(target, &main, rt.handle().clone());
    assert_eq!(again.progress(&["s".into()]).unwrap(), vec![("s".to_string(), 2)]);
    let keys: Vec<String> = objects(&bucket, "old/").into_iter().map(|o| o.0).collect();
    let expected = [
        "old/.skippr/legacy-owner".to_string(),
        "old/s/00000000000000000000.jsonl".to_string(),
        "old/s/00000000000000000001.jsonl".to_string(),
        format!("old/s/{}.00000000000000000002.jsonl", main.tag()),
        format!("old/s/{}.00000000000000000000.jsonl", second.tag()),
    ];
    let mut expected = expected.to_vec();
    expected.sort();
    assert_eq!(keys, expected);
}
