//! Records a sink refuses (`run --dead-letter`): the refusal committed to
//! the WAL before anything follows from it, the rest sent to the sink under
//! the same number, then, once the sink holds an attempt (committed as the
//! plan's settlement), the refused records to the dead-letter destination,
//! all again with the same ids and bytes after a restart; a refused attempt
//! that landed after all voids the refusals after it; without dead letters
//! a refusal stops the engine naming the record.

use super::*;
use crate::compaction::letters_id;
use crate::config::DeadLetters;
use crate::dead_letters::FATAL_ALONE;
use crate::io::{PluginOp, RefusedIndex};
use crate::wal::{CompactionDone, Refusal, Settled};

const WALL: u64 = 1_764_990_000_000;

fn with_dead_letters() -> HostConfig {
    let limits = DeadLetters { max: 1_000, window: 10_000 };
    HostConfig { dead_letters: Some(limits), wall_origin_ms: WALL, ..config() }
}

fn refuse(indices: &[(u32, &str)]) -> Result<IoReply, IoError> {
    let list = indices.iter().map(|&(index, reason)| RefusedIndex { index, reason: reason.into() }).collect();
    Ok(IoReply::Sink { outcome: SinkOutcome::Refused(list), rows: 0 })
}

fn applied() -> Result<IoReply, IoError> {
    Ok(IoReply::Sink { outcome: SinkOutcome::Applied, rows: 0 })
}

/// Every refusal, settlement and compaction-done frame the WAL holds, in
/// order.
fn decisions(h: &Harness) -> (Vec<Refusal>, Vec<Settled>, Vec<CompactionDone>) {
    let files: Vec<(SegmentId, &[u8])> = h.disk.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    let (mut refusals, mut settled, mut done) = (Vec::new(), Vec::new(), Vec::new());
    for frame in scan(&files, false).unwrap().into_iter().flat_map(|s| s.groups).flat_map(|g| g.frames) {
        match frame {
            Frame::Refused(r) => refusals.push(r),
            Frame::Settled(x) => settled.push(x),
            Frame::CompactionDone(d) => done.push(d),
            _ => {}
        }
    }
    (refusals, settled, done)
}

/// The dead-letter batch sent: (request, id, seq, lines). The harness's
/// records are not JSON: each line's `record` is checked to be the
/// record's bytes and read as its first byte (the position).
fn letters_sent(h: &mut Harness) -> (IoId, CompactionId, CompactionSeq, Vec<serde_json::Value>) {
    let (io, (id, seq, lines)) = h.take(|op| match op {
        IoOp::Plugin(PluginOp::DeadLetters(a)) => Some((a.id, a.seq, a.records.iter().map(letter).collect())),
        _ => None,
    });
    (io, id, seq, lines)
}

fn letter(line: &[u8]) -> serde_json::Value {
    let at = line.windows(9).position(|w| w == b"\"record\":").expect("a record") + 9;
    let record = &line[at..line.len() - 1];
    assert_eq!((record.len(), line.last()), (3, Some(&b'}')), "the record's bytes, then the end");
    assert!(record.iter().all(|&b| b == record[0]));
    let mut json = line[..at].to_vec();
    json.extend_from_slice(format!("{}}}", record[0]).as_bytes());
    serde_json::from_slice(&json).expect("a dead letter is JSON")
}

/// Positions of the records of the sink apply in flight, from their bytes.
fn applied_positions(h: &Harness) -> Vec<u8> {
    h.held
        .iter()
        .find_map(|(_, op)| match op {
            IoOp::Plugin(PluginOp::SinkApply(a)) => Some(a.records.iter().map(|r| r[0]).collect()),
            _ => None,
        })
        .expect("a sink apply in flight")
}

#[test]
fn refused_records_are_decided_in_the_wal_then_the_rest_go_to_the_sink_and_they_to_the_dead_letters() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 4);
    let (apply, id, seq, n) = h.sink_apply();
    assert_eq!(n, 4);
    h.now = Instant::from_micros(2_500_000);
    h.answer(apply, refuse(&[(1, "SQLSTATE 22P02: bad"), (3, "worse")]));
    // The decision is in the WAL before anything follows from it.
    let (refusals, settled, done) = decisions(&h);
    assert_eq!(refusals.len(), 1);
    let r = &refusals[0];
    assert_eq!((r.id, r.seq, r.at_ms), (id, seq, WALL + 2_500));
    let where_ = r.records.iter().map(|x| (x.position.0, x.reason.as_str())).collect::<Vec<_>>();
    assert_eq!(where_, vec![(1, "SQLSTATE 22P02: bad"), (3, "worse")]);
    assert!(settled.is_empty() && done.is_empty());
    // The rest goes to the sink under the same number...
    assert_eq!(applied_positions(&h), vec![0, 2]);
    let (apply, then, seq2, n2) = h.sink_apply();
    assert_eq!((then, seq2, n2), (r.then, seq, 2));
    assert_ne!(then, id);
    assert!(!h.has(|op| matches!(op, IoOp::Plugin(PluginOp::DeadLetters(_)))));
    h.answer(apply, applied());
    // ...and once the sink holds it, that is committed, and the refused
    // records go to the dead letters.
    let (_, settled, done) = decisions(&h);
    let x = Settled {
        sink: SinkId(0),
        stream: StreamId(0),
        seq,
        held: then,
        letters: Some(CompactionSeq(0)),
        quarantined: 0,
    };
    assert_eq!((settled, done.len()), (vec![x], 0));
    assert_eq!(h.refused, vec![vec!["SQLSTATE 22P02: bad".to_string(), "worse".to_string()]]);
    let (io, letters, letters_seq, lines) = letters_sent(&mut h);
    assert_eq!((letters, letters_seq), (letters_id(then), CompactionSeq(0)));
    assert_eq!(lines.len(), 2);
    assert_eq!((&lines[0]["position"], &lines[0]["record"]), (&1.into(), &1.into()));
    assert_eq!(lines[0]["reason"], "SQLSTATE 22P02: bad");
    assert_eq!(lines[0]["compaction_id"], format!("{id}"));
    assert_eq!(lines[1]["decided_at_ms"], WALL + 2_500);
    assert_eq!((lines[1]["stream"].as_str(), lines[1]["source"].as_str()), (Some("orders"), Some("src")));
    h.answer(io, applied());
    let (_, _, done) = decisions(&h);
    let records = Some(2);
    assert_eq!(done, vec![CompactionDone { sink: SinkId(0), stream: StreamId(0), id: then, seq, records }]);
    let c = h.host.committed();
    assert!(c.open.is_empty() && c.refusals.is_empty() && c.settled.is_empty());
    assert_eq!(c.acked(SinkId(0), key0()), Position(4));
}

#[test]
fn after_a_restart_the_same_attempt_and_the_same_dead_letters_are_sent_again() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 4);
    let (apply, ..) = h.sink_apply();
    h.answer(apply, refuse(&[(2, "bad")]));
    let (_, then, ..) = h.sink_apply();
    // A crash before the sink's answer: the next start sends the same
    // attempt; refused again, a second decision.
    let mut again = Harness::start_full(with_dead_letters(), h.disk.clone(), h.offsets.clone(), Vec::new());
    let (apply, id, ..) = again.sink_apply();
    assert_eq!(id, then);
    again.answer(apply, refuse(&[(0, "also bad")]));
    let (refusals, ..) = decisions(&again);
    assert_eq!(refusals.len(), 2);
    assert_eq!((refusals[1].id, refusals[1].records[0].position), (then, Position(0)));
    assert_eq!(applied_positions(&again), vec![1, 3]);
    let (apply, last, ..) = again.sink_apply();
    again.answer(apply, applied());
    let (_, first_id, letters_seq, first) = letters_sent(&mut again);
    assert_eq!((first_id, letters_seq, first.len()), (letters_id(last), CompactionSeq(0), 2));
    // A crash before the dead letters' answer: the same bytes under the
    // same id, and nothing sent to the sink (it holds the attempt).
    let mut third = Harness::start_full(with_dead_letters(), again.disk.clone(), again.offsets.clone(), Vec::new());
    let (io, id, seq, lines) = letters_sent(&mut third);
    assert_eq!((id, seq, &lines), (first_id, CompactionSeq(0), &first));
    assert!(!third.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))));
    third.answer(io, applied());
    assert_eq!(decisions(&third).2.last().map(|d| d.id), Some(last));
}

#[test]
fn a_refused_attempt_that_landed_after_all_voids_the_refusals_after_it() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 4);
    let (apply, id, ..) = h.sink_apply();
    h.answer(apply, refuse(&[(1, "bad")]));
    // The sink holds another batch under the number: the plan's own
    // attempt, sent by a process that died, landed after the refusal.
    let (apply, ..) = h.sink_apply();
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Fatal, rows: 0 }));
    let (apply, probe, _, n) = h.sink_apply();
    assert_eq!((probe, n), (id, 4), "the attempt before, whole");
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::AlreadyApplied, rows: 0 }));
    let (_, settled, done) = decisions(&h);
    assert_eq!(settled[0].held, id);
    assert_eq!(settled[0].letters, None, "no refusal stands: every record is in the sink");
    assert!(!h.has(|op| matches!(op, IoOp::Plugin(PluginOp::DeadLetters(_)))));
    assert_eq!(done.last().map(|d| d.id), Some(id));
    assert!(h.refused.is_empty());
    // Another batch under the number and no attempt of ours: a conflict.
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 4);
    let (apply, id, ..) = h.sink_apply();
    h.answer(apply, refuse(&[(1, "bad")]));
    // The later attempt answered `fatal`, then the plan's own, again and
    // again (with dead letters on, another process's attempt may hold the
    // number until this one learns it was superseded): it stands at last.
    let mut fatal_answers = 0;
    while h.stopped.is_none() && fatal_answers < 20 {
        if h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))) {
            let (apply, ..) = h.sink_apply();
            h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::Fatal, rows: 0 }));
            fatal_answers += 1;
        } else {
            let (at, _) = h.host.poll_timeout().expect("a retry is due");
            h.now = at;
            h.host.handle(at, Input::Timeout);
            h.settle();
        }
    }
    let seq = CompactionSeq(0);
    assert_eq!(h.stopped, Some(StopReason::SinkFatal { sink: SinkId(0), stream: StreamId(0), id, seq }));
    assert_eq!(fatal_answers, 1 + 8, "the later attempt once, the plan's own eight times");
}

#[test]
fn without_dead_letters_a_refusal_stops_the_engine_naming_the_first_record() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 4);
    let (apply, id, ..) = h.sink_apply();
    h.answer(apply, refuse(&[(2, "bad"), (3, "worse")]));
    let expected = StopReason::SinkRefused {
        sink: SinkId(0),
        stream: StreamId(0),
        id,
        key: key0(),
        position: Position(2),
        reason: "bad".into(),
        refused: 2,
    };
    assert_eq!(h.stopped, Some(expected));
    assert!(decisions(&h).0.is_empty(), "nothing of it is committed");
}

#[test]
fn a_refusal_that_names_no_record_of_the_batch_in_order_breaks_the_protocol() {
    for bad in [&[(4, "past the end")][..], &[(2, "a"), (1, "b")], &[(1, "a"), (1, "a")]] {
        let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
        h.open_source();
        h.feed(0, 4);
        let (apply, ..) = h.sink_apply();
        h.answer(apply, refuse(bad));
        assert!(matches!(h.stopped, Some(StopReason::SinkProtocol { .. })), "{bad:?}: {:?}", h.stopped);
        assert!(decisions(&h).0.is_empty());
    }
}

#[test]
fn the_breaker_stops_before_more_are_refused_than_allowed_counting_from_the_wal_across_restarts() {
    let limits = DeadLetters { max: 2, window: 100 };
    let cfg = || HostConfig { dead_letters: Some(limits), ..with_dead_letters() };
    let mut h = Harness::start_full(cfg(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 4);
    let (apply, ..) = h.sink_apply();
    h.answer(apply, refuse(&[(1, "bad")]));
    let (apply, ..) = h.sink_apply();
    h.answer(apply, applied());
    let (io, ..) = letters_sent(&mut h);
    h.answer(io, applied());
    assert_eq!(h.host.committed().breaker.refused_within(100), 1);
    // A restart counts on from the WAL: two more refused make three of the
    // last eight decided, past the bound of two.
    let mut again = Harness::start_full(cfg(), h.disk.clone(), h.offsets.clone(), Vec::new());
    assert_eq!(again.host.committed().breaker.decided, 4);
    again.open_source();
    again.feed(4, 8);
    let (apply, ..) = again.sink_apply();
    again.answer(apply, refuse(&[(0, "bad"), (1, "bad")]));
    let (apply, ..) = again.sink_apply();
    again.answer(apply, applied());
    let (sink, stream) = (SinkId(0), StreamId(0));
    assert_eq!(again.stopped, Some(StopReason::DeadLetterLimit { sink, stream, refused: 3, max: 2, window: 100 }));
    assert!(!again.has(|op| matches!(op, IoOp::Plugin(PluginOp::DeadLetters(_)))), "nothing of it goes on");
    assert_eq!(decisions(&again).1.len(), 1, "the second plan did not settle");
    // Once four more records are decided, a window of three no longer
    // reaches the first refusal.
    let narrow = HostConfig { dead_letters: Some(DeadLetters { max: 2, window: 3 }), ..with_dead_letters() };
    let mut narrow = Harness::start_full(narrow, h.disk.clone(), h.offsets.clone(), Vec::new());
    narrow.open_source();
    narrow.feed(4, 8);
    let (apply, ..) = narrow.sink_apply();
    narrow.answer(apply, applied());
    narrow.feed(8, 12);
    let (apply, ..) = narrow.sink_apply();
    narrow.answer(apply, refuse(&[(0, "bad"), (1, "bad")]));
    let (apply, ..) = narrow.sink_apply();
    narrow.answer(apply, applied());
    assert_eq!(narrow.stopped, None);
    assert!(narrow.has(|op| matches!(op, IoOp::Plugin(PluginOp::DeadLetters(_)))));
}

fn fatal() -> Result<IoReply, IoError> {
    Ok(IoReply::Sink { outcome: SinkOutcome::Fatal, rows: 0 })
}

/// `fatal` from a sink that cannot name records (protocol version 1).
fn unnamed() -> Result<IoReply, IoError> {
    Ok(IoReply::Sink { outcome: SinkOutcome::FatalUnnamed, rows: 0 })
}

/// Every split the WAL holds, in order.
fn splits(h: &Harness) -> Vec<crate::wal::Split> {
    let files: Vec<(SegmentId, &[u8])> = h.disk.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    let frames = scan(&files, false).unwrap().into_iter().flat_map(|s| s.groups).flat_map(|g| g.frames);
    frames.filter_map(|f| if let Frame::Split(x) = f { Some(x) } else { None }).collect()
}

/// Answers every sink apply as a version 1 sink that cannot take the
/// record at `bad` would (`fatal` for any batch holding it), and every
/// dead-letter batch `applied`, until nothing is in flight. Returns the
/// batches the sink took: (seq, positions).
fn run_against_poison(h: &mut Harness, bad: u8) -> Vec<(u64, Vec<u8>)> {
    let mut took = Vec::new();
    for _ in 0..200 {
        if h.has(|op| matches!(op, IoOp::Plugin(PluginOp::DeadLetters(_)))) {
            let (io, ..) = letters_sent(h);
            h.answer(io, applied());
        } else if h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))) {
            let positions = applied_positions(h);
            let (apply, _, seq, _) = h.sink_apply();
            if positions.contains(&bad) {
                h.answer(apply, unnamed());
            } else {
                took.push((seq.0, positions));
                h.answer(apply, applied());
            }
        } else {
            return took;
        }
    }
    panic!("the engine kept sending");
}

#[test]
fn a_batch_a_sink_answers_fatal_for_whole_is_split_down_to_the_record_it_cannot_take() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 8);
    let took = run_against_poison(&mut h, 5);
    assert_eq!(h.stopped, None);
    // 0..8 fatal: cut to 0..4, taken as batch 0; then the rest of what was
    // cut, 4..8, fatal, cut to 4..6, fatal (nothing before it is held), cut
    // to 4..5, taken as batch 1; then the rest of 4..6, 5..6, fatal: 5
    // refused, the empty rest taken as batch 2; then 6..8 as batch 3.
    // Numbers stay dense.
    let want: Vec<(u64, Vec<u8>)> = vec![(0, vec![0, 1, 2, 3]), (1, vec![4]), (2, vec![]), (3, vec![6, 7])];
    assert_eq!(took, want);
    let cut: Vec<Vec<(u64, u64)>> =
        splits(&h).iter().map(|x| x.ranges.iter().map(|r| (r.from.0, r.to.0)).collect()).collect();
    assert_eq!(cut, vec![vec![(0, 4)], vec![(4, 6)], vec![(4, 5)]]);
    let seqs: Vec<u64> = h.split.iter().map(|s| s.0).collect();
    assert_eq!(seqs, vec![0, 1, 1], "each split told, once committed, with its batch's number");
    let (refusals, ..) = decisions(&h);
    assert_eq!(refusals.len(), 1);
    assert_eq!((refusals[0].records[0].position, refusals[0].records[0].reason.as_str()), (Position(5), FATAL_ALONE));
    assert_eq!(h.host.committed().acked(SinkId(0), key0()), Position(8));
    assert!(h.host.committed().splits.is_empty(), "nothing of a done plan is kept");
}

#[test]
fn a_split_is_the_wals_a_restart_sends_the_cut_batch_under_the_same_id() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 4);
    let (apply, whole, seq, _) = h.sink_apply();
    h.answer(apply, unnamed());
    let (_, cut, seq2, n) = h.sink_apply();
    assert_eq!((seq2, n), (seq, 2));
    assert_eq!(splits(&h)[0].then, cut);
    assert_ne!(cut, whole);
    // A crash before the answer: the next start sends the cut batch again,
    // not the whole one, and does not split again.
    let mut again = Harness::start_full(with_dead_letters(), h.disk.clone(), h.offsets.clone(), Vec::new());
    let (apply, id, seq3, n) = again.sink_apply();
    assert_eq!((id, seq3, n), (cut, seq, 2));
    again.answer(apply, applied());
    let (_, _, done) = decisions(&again);
    assert_eq!(done.last().map(|d| (d.id, d.records)), Some((cut, Some(2))));
    assert_eq!(again.host.committed().acked(SinkId(0), key0()), Position(2));
    // The rest is planned again, under the next number.
    again.open_source();
    let (_, _, seq4, n) = again.sink_apply();
    assert_eq!((seq4, n), (CompactionSeq(seq.0 + 1), 2));
}

#[test]
fn a_batch_from_before_a_split_that_landed_after_all_settles_the_plan_whole() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 4);
    let (apply, whole, seq, _) = h.sink_apply();
    h.answer(apply, unnamed());
    // The cut batch answered `fatal` in this run: it is cut again, and the
    // whole one, answered `fatal` in this run too, is not asked about.
    let (apply, cut, ..) = h.sink_apply();
    h.answer(apply, unnamed());
    assert_eq!(splits(&h).len(), 2);
    let (_, _, _, n) = h.sink_apply();
    assert_eq!(n, 1);
    // A restart: the process that died may have sent any version the WAL
    // holds, and the whole one lands now. The last version is answered
    // `fatal` (the number is held); the earlier ones are asked about,
    // newest first, and the whole one is found held.
    let mut h = Harness::start_full(with_dead_letters(), h.disk.clone(), h.offsets.clone(), Vec::new());
    let (apply, ..) = h.sink_apply();
    h.answer(apply, unnamed());
    let (apply, probe, ..) = h.sink_apply();
    assert_eq!(probe, cut);
    h.answer(apply, unnamed());
    let (apply, probe, seq2, n) = h.sink_apply();
    assert_eq!((probe, seq2, n), (whole, seq, 4));
    h.answer(apply, Ok(IoReply::Sink { outcome: SinkOutcome::AlreadyApplied, rows: 0 }));
    let (refusals, settled, done) = decisions(&h);
    assert!(refusals.is_empty());
    assert_eq!((settled[0].held, settled[0].letters), (whole, None));
    assert_eq!(done.last().map(|d| (d.id, d.records)), Some((whole, Some(4))));
    assert_eq!(splits(&h).len(), 2, "no split after the restart");
    // Acknowledged, and planned from, where the whole batch ended.
    assert_eq!(h.host.committed().acked(SinkId(0), key0()), Position(4));
    h.open_source();
    h.feed(4, 6);
    let positions = applied_positions(&h);
    let (_, _, seq3, _) = h.sink_apply();
    assert_eq!((seq3, positions), (CompactionSeq(1), vec![4, 5]));
}

#[test]
fn without_dead_letters_a_batch_answered_fatal_stops_the_engine_unsplit() {
    let mut h = Harness::start(BTreeMap::new(), BTreeMap::new());
    h.open_source();
    h.feed(0, 4);
    let (apply, id, seq, _) = h.sink_apply();
    h.answer(apply, unnamed());
    assert_eq!(h.stopped, Some(StopReason::SinkFatal { sink: SinkId(0), stream: StreamId(0), id, seq }));
    assert!(splits(&h).is_empty());
}

/// A sink that can name the records it cannot take (version 2, the
/// built-in ones) means something else by `fatal` (a trigger, a conflict
/// under the number): the batch is not split, and `fatal` stands.
#[test]
fn a_sink_that_names_records_is_not_split_when_it_answers_fatal() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 4);
    let mut answers = 0;
    while h.stopped.is_none() && answers < 20 {
        if h.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))) {
            let (apply, _, _, n) = h.sink_apply();
            assert_eq!(n, 4, "the whole batch, every time");
            h.answer(apply, fatal());
            answers += 1;
        } else {
            let (at, _) = h.host.poll_timeout().expect("a retry is due");
            h.now = at;
            h.host.handle(at, Input::Timeout);
            h.settle();
        }
    }
    assert!(matches!(h.stopped, Some(StopReason::SinkFatal { .. })), "{:?}", h.stopped);
    assert!(splits(&h).is_empty() && decisions(&h).0.is_empty());
}

#[test]
fn after_a_split_the_rest_of_the_batch_cut_is_planned_alone_then_batches_fill_up_again() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.feed(0, 8);
    let (apply, ..) = h.sink_apply();
    h.answer(apply, unnamed());
    // Records 8..16 are committed while the first half is out.
    h.feed(8, 16);
    assert_eq!(applied_positions(&h), vec![0, 1, 2, 3]);
    let (apply, ..) = h.sink_apply();
    h.answer(apply, applied());
    // The rest of what was cut holds the record the sink cannot take: it
    // is planned alone, not filled up with 8..16.
    assert_eq!(applied_positions(&h), vec![4, 5, 6, 7]);
    let took = run_against_poison(&mut h, 5);
    assert_eq!(took.last(), Some(&(3, (6..16).collect())), "once 5 is refused, a batch as large as the records allow");
    assert_eq!(h.host.committed().acked(SinkId(0), key0()), Position(16));
}

/// Records `0..4` of partition 0 (three bytes each), record 1 `{` and
/// record 2 not UTF-8, both refused at intake.
fn read_with_two_faults(h: &mut Harness) {
    let (id, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    let mut b = batch(0, 4);
    b.records[1].bytes = b"{".to_vec();
    b.records[2].bytes = b"\"\xff\"".to_vec();
    let fault = |p: u64, fault: RecordFault| IntakeFault { position: Position(p), fault, why: "fix it".into() };
    b.faults = vec![fault(1, RecordFault::NotJson("EOF".into())), fault(2, RecordFault::NotUtf8 { at: 1 })];
    h.answer(id, Ok(IoReply::Batches { batches: vec![b], exhausted: false }));
}

#[test]
fn records_refused_at_intake_are_committed_quarantined_and_go_to_the_dead_letters_never_to_the_sink() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    h.now = Instant::from_micros(1_000_000);
    read_with_two_faults(&mut h);
    assert_eq!(h.stopped, None);
    assert_eq!(h.committed_positions(), vec![0, 1, 2, 3], "every record is in the WAL, positions dense");
    let (apply, records) = h.sink_records();
    assert_eq!(records, vec![vec![0; 3], vec![3; 3]], "the sink gets only the good records");
    h.answer(apply, applied());
    // The settlement says how many were left out; then the letters go.
    let (refusals, settled, done) = decisions(&h);
    assert!(refusals.is_empty() && done.is_empty());
    assert_eq!((settled.len(), settled[0].quarantined, settled[0].letters), (1, 2, Some(CompactionSeq(0))));
    assert_eq!(h.refused, vec![vec!["refused at intake".to_string(); 2]]);
    let (io, (letters_id_sent, lines)) = h.take(|op| match op {
        IoOp::Plugin(PluginOp::DeadLetters(a)) => {
            Some((a.id, a.records.iter().map(<[u8]>::to_vec).collect::<Vec<_>>()))
        }
        _ => None,
    });
    assert_eq!(letters_id_sent, letters_id(settled[0].held));
    let lines: Vec<serde_json::Value> = lines.iter().map(|l| serde_json::from_slice(l).expect("JSON")).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!((&lines[0]["position"], &lines[0]["record_text"]), (&1.into(), &"{".into()));
    assert_eq!((&lines[1]["position"], &lines[1]["record_base64"]), (&2.into(), &"Iv8i".into()));
    assert_eq!(lines[0]["reason"], "refused at intake: it is not exactly one JSON value: EOF");
    assert_eq!(lines[1]["decided_at_ms"], WALL + 1_000, "the time intake decided, from the WAL");
    assert_eq!(lines[0]["compaction_id"], format!("{}", settled[0].held));
    h.answer(io, applied());
    let (_, _, done) = decisions(&h);
    assert_eq!(done.iter().map(|d| d.records).collect::<Vec<_>>(), vec![Some(2)]);
    let c = h.host.committed();
    assert!(c.open.is_empty() && c.settled.is_empty());
    assert_eq!(c.acked(SinkId(0), key0()), Position(4));
    assert_eq!(c.breaker.refused_within(100), 2, "the breaker counts them");
}

#[test]
fn after_a_restart_records_refused_at_intake_get_the_same_dead_letters() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    read_with_two_faults(&mut h);
    let (apply, _) = h.sink_records();
    h.answer(apply, applied());
    let (_, first) = h.take(|op| match op {
        IoOp::Plugin(PluginOp::DeadLetters(a)) => Some((a.id, a.seq, a.records.clone())),
        _ => None,
    });
    // A crash before the dead letters' answer: the same letters again, and
    // nothing to the sink.
    let mut again = Harness::start_full(with_dead_letters(), h.disk.clone(), h.offsets.clone(), Vec::new());
    let (io, second) = again.take(|op| match op {
        IoOp::Plugin(PluginOp::DeadLetters(a)) => Some((a.id, a.seq, a.records.clone())),
        _ => None,
    });
    assert_eq!(first, second);
    assert!(!again.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))));
    again.answer(io, applied());
    assert_eq!(decisions(&again).2.len(), 1);
    // A crash before the sink's answer: the plan is sent again without them.
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    read_with_two_faults(&mut h);
    let (_, sent) = h.sink_records();
    let mut again = Harness::start_full(with_dead_letters(), h.disk.clone(), h.offsets.clone(), Vec::new());
    let (_, resent) = again.sink_records();
    assert_eq!(sent, resent);
}

#[test]
fn records_refused_at_intake_count_toward_the_breaker() {
    let narrow = HostConfig { dead_letters: Some(DeadLetters { max: 1, window: 100 }), ..with_dead_letters() };
    let mut h = Harness::start_full(narrow, BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    read_with_two_faults(&mut h);
    let (apply, _) = h.sink_records();
    h.answer(apply, applied());
    let (sink, stream) = (SinkId(0), StreamId(0));
    assert_eq!(h.stopped, Some(StopReason::DeadLetterLimit { sink, stream, refused: 2, max: 1, window: 100 }));
    assert!(decisions(&h).1.is_empty(), "nothing of the batch is settled");
}

#[test]
fn a_record_too_large_stops_the_daemon_even_with_dead_letters() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    let (id, ()) = h.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
    let mut b = batch(0, 4);
    let fault = RecordFault::TooLarge { bytes: 3, bytes_max: 2 };
    b.faults = vec![IntakeFault { position: Position(3), fault, why: "raise it".into() }];
    h.answer(id, Ok(IoReply::Batches { batches: vec![b], exhausted: false }));
    assert_eq!(h.stopped, Some(StopReason::SourceRefused { source: SourceId(0), why: "raise it".into() }));
    assert!(h.committed_positions().is_empty());
}

#[test]
fn records_refused_at_intake_stop_a_later_run_without_dead_letters_before_their_batch_is_sent() {
    let mut h = Harness::start_full(with_dead_letters(), BTreeMap::new(), BTreeMap::new(), Vec::new());
    h.open_source();
    read_with_two_faults(&mut h);
    // A crash before the sink's answer; the next start has dead letters off.
    let off = HostConfig { dead_letters: None, ..with_dead_letters() };
    let again = Harness::start_full(off, h.disk.clone(), h.offsets.clone(), Vec::new());
    let (sink, stream, seq) = (SinkId(0), StreamId(0), CompactionSeq(0));
    assert_eq!(again.stopped, Some(StopReason::DeadLettersOff { sink, stream, seq }));
    assert!(!again.has(|op| matches!(op, IoOp::Plugin(PluginOp::SinkApply(_)))), "nothing of the batch is sent");
}
