//! One contract, four sinks: the directory, S3 and PostgreSQL sinks (against
//! the local servers `./test.sh` starts) and the simulator's model of a sink
//! all answer a batch by core's sink ledger, and this suite holds each of
//! them to the same cases:
//!
//! - a replay of a batch, by the same process or a new one, is
//!   `already_applied`;
//! - another id under a taken number is `fatal`;
//! - the same id with other records is `fatal`;
//! - two appliers handed the same batches at once: each batch once
//!   `applied`, once `already_applied`;
//! - progress at recovery: a new process names the highest number per
//!   stream, none for a stream it never had;
//! - another pipeline: its own numbers in a shared directory or prefix; a
//!   PostgreSQL table of another pipeline's refused.

use skippr_core::ledger::Scope;
use skippr_core::{CompactionId, CompactionSeq, Records, SinkOutcome, StreamId};
use skippr_io::plugin::postgres_sink::{connection_config, PostgresSettings, PostgresSink};
use skippr_io::plugin::s3_sink::{S3Sink, S3SinkTarget};
use skippr_io::plugin::{DirSink, PluginError, Sink};
use skippr_sim::plugins::SimSink;
use skippr_tests::aws;
use std::sync::{Arc, Mutex};

/// Opens a sink on the suite's one destination as a new process would, for
/// a pipeline; `Err` when the sink refuses to start.
type Open<'a> = &'a (dyn Fn(&str) -> Result<Box<dyn Sink>, String> + Sync);

/// What a second pipeline finds on the same destination.
#[derive(PartialEq)]
enum Sharing {
    /// Its own numbers beside the first's.
    OwnNumbers,
    /// The destination's tables are the first's: refused at start.
    Refused,
}

fn batch(seq: u64, variant: u8) -> Records {
    let lines: Vec<String> = (0..3).map(|i| format!("{{\"seq\":{seq},\"i\":{i},\"v\":{variant}}}")).collect();
    lines.iter().map(|l| l.as_bytes()).collect()
}

fn id(seq: u64) -> CompactionId {
    CompactionId(0x5eed_0000 + seq)
}

/// An apply as the driver makes it: an error is retried. (Of two directory
/// sinks at once, the later one's first apply removes the earlier one's
/// temporary files, whose link then fails once.)
fn as_the_driver(sink: &mut Box<dyn Sink>, seq: u64, id: CompactionId, records: &Records) -> SinkOutcome {
    for _ in 0..100 {
        if let Ok(outcome) = sink.apply("s", seq, id, records) {
            return outcome;
        }
    }
    panic!("batch {seq}: a hundred errors in a row")
}

fn contract(name: &str, open: Open<'_>, sharing: Sharing) {
    use SinkOutcome::*;
    let mut sink = open("main").unwrap();
    let apply = |sink: &mut Box<dyn Sink>, seq: u64, id: CompactionId, records: &Records| {
        sink.apply("s", seq, id, records).unwrap_or_else(|e| panic!("{name}: apply {seq}: {e}"))
    };
    // A replay, by this process and by a new one.
    assert_eq!(apply(&mut sink, 0, id(0), &batch(0, 0)), Applied, "{name}: a new batch");
    assert_eq!(apply(&mut sink, 0, id(0), &batch(0, 0)), AlreadyApplied, "{name}: replayed");
    let mut again = open("main").unwrap();
    assert_eq!(apply(&mut again, 0, id(0), &batch(0, 0)), AlreadyApplied, "{name}: replayed by a new process");
    // Another id under a taken number; other records under the same id.
    assert_eq!(apply(&mut again, 0, id(99), &batch(0, 0)), Fatal, "{name}: another id under a number");
    assert_eq!(apply(&mut again, 0, id(0), &batch(0, 1)), Fatal, "{name}: other records under an id");
    // Two appliers at once, each handed the same batches.
    let answers: Vec<Vec<SinkOutcome>> = std::thread::scope(|s| {
        let appliers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut sink = open("main").unwrap();
                    (1..=20).map(|seq| as_the_driver(&mut sink, seq, id(seq), &batch(seq, 0))).collect::<Vec<_>>()
                })
            })
            .collect();
        appliers.into_iter().map(|a| a.join().unwrap()).collect()
    });
    for (i, (a, b)) in answers[0].iter().zip(&answers[1]).enumerate() {
        let mut pair = [a.clone(), b.clone()];
        pair.sort_by_key(|o| *o != Applied);
        assert_eq!(pair, [Applied, AlreadyApplied], "{name}: batch {} applied by two at once", i + 1);
    }
    // Progress at recovery.
    let mut recovered = open("main").unwrap();
    let progress = recovered.progress(&["s".to_string(), "t".to_string()]).unwrap();
    assert_eq!(progress, vec![("s".to_string(), 20)], "{name}: progress at recovery");
    // Another pipeline on the same destination.
    match (open("second"), sharing) {
        (Ok(mut other), Sharing::OwnNumbers) => {
            assert!(other.progress(&["s".to_string()]).unwrap().is_empty(), "{name}: the second has no batches");
            assert_eq!(apply(&mut other, 0, id(1000), &batch(1000, 0)), Applied, "{name}: the second's number 0");
            assert_eq!(apply(&mut other, 0, id(1000), &batch(1000, 0)), AlreadyApplied, "{name}");
            let progress = open("main").unwrap().progress(&["s".to_string()]).unwrap();
            assert_eq!(progress, vec![("s".to_string(), 20)], "{name}: the first's numbers untouched");
        }
        (Err(why), Sharing::Refused) => {
            assert!(why.contains("belongs to pipeline 'main'"), "{name}: {why}");
        }
        (Ok(_), Sharing::Refused) => panic!("{name}: a second pipeline was let into the first's tables"),
        (Err(why), Sharing::OwnNumbers) => panic!("{name}: a second pipeline was refused: {why}"),
    }
}

const WAL: &str = "disk://contract/wal/";

#[test]
fn the_directory_sink_keeps_the_contract() {
    let tmp = tempfile::tempdir().unwrap();
    let open = |pipeline: &str| -> Result<Box<dyn Sink>, String> {
        DirSink::open(tmp.path(), &Scope::new(pipeline, WAL)).map(|s| Box::new(s) as Box<dyn Sink>).map_err(|e| e.0)
    };
    contract("dir", &open, Sharing::OwnNumbers);
}

#[test]
fn the_s3_sink_keeps_the_contract() {
    let rt = aws::runtime();
    let bucket = rt.block_on(aws::bucket("contract"));
    let sdk = rt.block_on(aws::sdk(&aws::endpoint()));
    for gzip in [false, true] {
        let target = rt.block_on(S3SinkTarget::connect(&sdk, &bucket, &format!("gzip-{gzip}/"), gzip)).unwrap();
        let open = |pipeline: &str| -> Result<Box<dyn Sink>, String> {
            Ok(Box::new(S3Sink::new(target.clone(), &Scope::new(pipeline, WAL), rt.handle().clone())))
        };
        contract(&format!("s3 (gzip {gzip})"), &open, Sharing::OwnNumbers);
    }
}

#[test]
fn the_postgres_sink_keeps_the_contract() {
    let url = std::env::var("SKIPPR_TEST_POSTGRES_URL").expect(
        "SKIPPR_TEST_POSTGRES_URL is not set: run the suite with ./test.sh, which starts the local PostgreSQL server",
    );
    let schema = format!("contract_{}", std::process::id());
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).unwrap();
    let config = connection_config(&url, None).unwrap();
    let settings = PostgresSettings::plain(config, &schema);
    let open = |pipeline: &str| -> Result<Box<dyn Sink>, String> {
        PostgresSink::open(settings.clone(), pipeline, WAL, &["s".to_string(), "t".to_string()])
            .map(|s| Box::new(s) as Box<dyn Sink>)
            .map_err(|e| e.0)
    };
    contract("postgres", &open, Sharing::Refused);
}

/// The simulator's sink behind the trait the real ones implement: one
/// ledger (the destination) shared by every "process" opened on it.
struct Model {
    destination: Arc<Mutex<SimSink>>,
}

/// Streams by name, as the engine numbers them.
fn stream_id(name: &str) -> StreamId {
    StreamId(["s", "t"].iter().position(|s| *s == name).expect("a stream of the suite") as u16)
}

impl Sink for Model {
    fn apply(
        &mut self,
        stream: &str,
        seq: u64,
        id: CompactionId,
        records: &Records,
    ) -> Result<SinkOutcome, PluginError> {
        let verdict = self.destination.lock().unwrap().apply(id, stream_id(stream), CompactionSeq(seq), records);
        Ok(verdict.outcome())
    }

    fn progress(&mut self, streams: &[String]) -> Result<Vec<(String, u64)>, PluginError> {
        let held = self.destination.lock().unwrap().progress();
        Ok(streams
            .iter()
            .filter_map(|s| held.iter().find(|(id, _)| *id == stream_id(s)).map(|(_, q)| (s.clone(), q.0)))
            .collect())
    }
}

#[test]
fn the_simulators_sink_keeps_the_contract() {
    let destination = Arc::new(Mutex::new(SimSink::default()));
    // The model is one pipeline of one WAL: a second is another ledger.
    let second = Arc::new(Mutex::new(SimSink::default()));
    let open = |pipeline: &str| -> Result<Box<dyn Sink>, String> {
        let destination = if pipeline == "main" { destination.clone() } else { second.clone() };
        Ok(Box::new(Model { destination }))
    };
    contract("model", &open, Sharing::OwnNumbers);
}

/// A sink that dedupes by id alone, as the simulator's did before the
/// ledger: the contract must fail it.
struct IdsOnly {
    applied: Arc<Mutex<std::collections::BTreeSet<CompactionId>>>,
}

impl Sink for IdsOnly {
    fn apply(&mut self, _: &str, _: u64, id: CompactionId, _: &Records) -> Result<SinkOutcome, PluginError> {
        let new = self.applied.lock().unwrap().insert(id);
        Ok(if new { SinkOutcome::Applied } else { SinkOutcome::AlreadyApplied })
    }
}

#[test]
fn the_contract_fails_a_sink_that_dedupes_by_id_alone() {
    let applied = Arc::new(Mutex::new(Default::default()));
    let open = |_: &str| -> Result<Box<dyn Sink>, String> { Ok(Box::new(IdsOnly { applied: applied.clone() })) };
    let failed =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| contract("ids only", &open, Sharing::OwnNumbers)));
    let why = failed.expect_err("the contract passed a sink that dedupes by id alone");
    let why = why.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(why.contains("another id under a number"), "{why}");
}
