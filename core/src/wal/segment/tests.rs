//! Codec tests: round trip, every single-bit flip, every truncation point,
//! stale bytes from an earlier use of the same file.

use super::*;
use crate::wal::scan::*;

const SEG: SegmentId = SegmentId(7);
const EPOCH: Epoch = Epoch(3);
const SIZE: usize = 4096;

fn key(p: u32) -> PartitionKey {
    PartitionKey { source: SourceId(1), partition: p }
}

fn batch(p: u32, from: u64, n: u64) -> Frame {
    let records = (from..from + n)
        .map(|i| Record { position: Position(i), bytes: format!("{{\"seq\":{i}}}").into_bytes() })
        .collect();
    Frame::SourceBatch(SourceBatch {
        key: key(p),
        stream: StreamId(0),
        end: Position(from + n),
        checkpoint: Some(vec![p as u8, from as u8]),
        records,
        counted: None,
        provisional: false,
    })
}

fn plan() -> Frame {
    Frame::CompactionPlanned(CompactionPlan {
        sink: SinkId(0),
        stream: StreamId(0),
        id: CompactionId(0xfeed),
        seq: CompactionSeq(0),
        schema: 9,
        ranges: vec![Range { key: key(0), from: Position(0), to: Position(3) }],
    })
}

fn refusal() -> Refusal {
    Refusal {
        sink: SinkId(0),
        stream: StreamId(0),
        id: CompactionId(0xfeed),
        seq: CompactionSeq(0),
        then: CompactionId(0xbeef),
        at_ms: 1_764_990_000_123,
        records: vec![RefusedRecord { key: key(0), position: Position(1), reason: "SQLSTATE 22P02: é".into() }],
    }
}

fn split() -> Split {
    let (sink, stream, seq, id, then) =
        (SinkId(0), StreamId(0), CompactionSeq(0), CompactionId(0xfeed), CompactionId(0xcafe));
    Split { sink, stream, id, seq, then, ranges: vec![Range { key: key(0), from: Position(0), to: Position(2) }] }
}

fn settled() -> Settled {
    let (sink, stream, seq, held) = (SinkId(0), StreamId(0), CompactionSeq(0), CompactionId(0xbeef));
    Settled { sink, stream, seq, held, letters: Some(CompactionSeq(2)), quarantined: 0 }
}

fn groups() -> Vec<Vec<Frame>> {
    vec![
        vec![Frame::Snapshot(Snapshot::default()), batch(0, 0, 3)],
        vec![
            batch(1, 0, 2),
            plan(),
            Frame::Split(split()),
            Frame::Refused(refusal()),
            Frame::Settled(settled()),
            Frame::Settled(Settled { quarantined: 2, ..settled() }),
        ],
        vec![
            Frame::CompactionDone(CompactionDone {
                sink: SinkId(0),
                stream: StreamId(0),
                id: CompactionId(0xfeed),
                seq: CompactionSeq(0),
                records: Some(3),
            }),
            Frame::SchemaDecision(SchemaDecision { stream: StreamId(0), fingerprint: 1 }),
            Frame::Skipped(Skipped {
                key: key(0),
                stream: StreamId(0),
                at: Position(4),
                next: Position(5),
                reason: "bad export".into(),
            }),
            batch(0, 5, 1),
        ],
    ]
}

/// A preallocated segment with the groups written; returns it and where each
/// group ends.
fn segment_with(segment: SegmentId, epoch: Epoch, first_lsn: u64, groups: &[Vec<Frame>]) -> (Vec<u8>, Vec<usize>) {
    let mut buf = encode_header(segment, epoch);
    let mut ends = Vec::new();
    for (i, frames) in groups.iter().enumerate() {
        let refs: Vec<&Frame> = frames.iter().collect();
        buf.extend(encode_group(segment, epoch, Lsn(first_lsn + i as u64), &refs));
        ends.push(buf.len());
    }
    buf.resize(SIZE, 0);
    (buf, ends)
}

fn scan_one(bytes: &[u8]) -> Result<Vec<ScannedSegment>, Corruption> {
    scan(&[(SEG, bytes)], false)
}

#[test]
fn round_trip() {
    let groups = groups();
    let (buf, ends) = segment_with(SEG, EPOCH, 0, &groups);
    let scanned = scan_one(&buf).unwrap();
    assert_eq!(scanned.len(), 1);
    let seg = &scanned[0];
    assert_eq!(seg.header_epoch, Some(EPOCH));
    assert_eq!(seg.end, *ends.last().unwrap() as u64);
    assert_eq!(seg.groups.len(), 3);
    for (i, g) in seg.groups.iter().enumerate() {
        assert_eq!(g.lsn, Lsn(i as u64));
        assert_eq!(g.epoch, EPOCH);
        assert_eq!(g.frames, groups[i]);
    }
}

#[test]
fn snapshots_keep_their_bytes_without_dead_letters_and_carry_them_with() {
    let names = Names { sources: vec!["s".into()], sinks: vec!["k".into()], streams: vec!["t".into()] };
    let plain = Snapshot { names, ..Snapshot::default() };
    let finished = Snapshot { finished: Some(Lsn(9)), ..plain.clone() };
    let next_letters = vec![(SinkId(0), StreamId(0), CompactionSeq(3))];
    let letters = Snapshot { letters: Box::new(LetterState { next_letters, ..Default::default() }), ..plain.clone() };
    let breaker = Breaker { decided: 40, refusals: vec![(12, 2), (40, 1)] };
    let settled = vec![settled(), Settled { quarantined: 5, ..settled() }];
    let state = LetterState { refusals: vec![refusal()], settled, breaker, ..Default::default() };
    let both = Snapshot { letters: Box::new(state), all_finished: Some(Lsn(12)), ..finished.clone() };
    let split = LetterState { splits: vec![split()], ..Default::default() };
    let split = Snapshot { letters: Box::new(split), ..plain.clone() };
    let with_split = LetterState { splits: vec![self::split()], ..(*both.letters).clone() };
    let all = Snapshot { letters: Box::new(with_split), ..both.clone() };
    let len = |s: &Snapshot| Frame::Snapshot(s.clone()).encoded_len();
    // As before dead letters: a snapshot with only terminal entries is 16
    // bytes longer than one without.
    assert_eq!(len(&finished), len(&plain) + 16);
    // A snapshot with splits is longer by them alone.
    assert_eq!(len(&all), len(&both) + 4 + Frame::Split(self::split()).encoded_len() - FRAME_HEADER_BYTES);
    let part = WindowPart { partition: 3, stream: StreamId(1), from: Position(10), to: Position(14), records: 4 };
    let tail = Tail { partition: 3, key: 99, digests: vec![1, 2], more: true };
    let key = PartitionKey { source: SourceId(0), partition: 3 };
    let windows = WindowState {
        open: vec![(SourceId(0), vec![part])],
        tails: vec![(SourceId(0), tail)],
        voids: vec![(key, Position(4), Position(10))],
    };
    let windowed = Snapshot { windows: Box::new(windows.clone()), ..plain.clone() };
    let windowed_all = Snapshot { windows: Box::new(windows), ..all.clone() };
    for s in [plain, finished, letters, both, split, all, windowed, windowed_all] {
        let (buf, _) = segment_with(SEG, EPOCH, 0, &[vec![Frame::Snapshot(s.clone())]]);
        let scanned = scan_one(&buf).unwrap();
        assert_eq!(scanned[0].groups[0].frames, vec![Frame::Snapshot(s)]);
    }
}

#[test]
fn every_single_bit_flip_is_detected() {
    let groups = groups();
    let (buf, ends) = segment_with(SEG, EPOCH, 0, &groups);
    let written = *ends.last().unwrap();
    let last_start = ends[ends.len() - 2];
    for bit in 0..written * 8 {
        let mut b = buf.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        match scan_one(&b) {
            Err(c) => {
                // Named at the header, or at the start of the flipped group.
                let byte = bit / 8;
                let at = if byte < SEGMENT_HEADER_BYTES {
                    0
                } else {
                    std::iter::once(SEGMENT_HEADER_BYTES)
                        .chain(ends.iter().copied())
                        .filter(|&e| e <= byte)
                        .max()
                        .unwrap()
                };
                assert_eq!((c.segment, c.offset), (SEG, at as u64), "flip at byte {byte}");
            }
            Ok(segs) => {
                // Only a flip in the last group may pass as a torn tail, and
                // then that group is dropped, never admitted changed.
                assert!(bit / 8 >= last_start, "flip at byte {} admitted silently", bit / 8);
                let admitted = &segs[0].groups;
                assert_eq!(admitted.len(), 2, "flip at byte {}", bit / 8);
                for (i, g) in admitted.iter().enumerate() {
                    assert_eq!(g.frames, groups[i]);
                }
            }
        }
    }
}

#[test]
fn flips_before_the_last_group_are_corruption_with_an_offset() {
    let (buf, ends) = segment_with(SEG, EPOCH, 0, &groups());
    let mut b = buf.clone();
    b[ends[0] + 30] ^= 0x10; // inside the second group
    let c = scan_one(&b).unwrap_err();
    assert_eq!(c, Corruption { segment: SEG, offset: ends[0] as u64, what: c.what });
    let mut b = buf;
    b[2] ^= 1; // the header
    assert_eq!(scan_one(&b).unwrap_err().offset, 0);
}

#[test]
fn every_truncation_point_is_a_clean_torn_tail() {
    let groups = groups();
    let (buf, ends) = segment_with(SEG, EPOCH, 0, &groups);
    let written = *ends.last().unwrap();
    for cut in SEGMENT_HEADER_BYTES..=written {
        // Cut short (a file that ends there) and zero-filled (preallocated);
        // zero-filling bytes that were zero already changes nothing.
        let short = &buf[..cut];
        let mut zeroed = buf.clone();
        zeroed[cut..].fill(0);
        let intact = |e: usize, b: &[u8]| e <= b.len() && b[..e] == buf[..e];
        for b in [short, zeroed.as_slice()] {
            let complete = ends.iter().filter(|&&e| intact(e, b)).count();
            let segs = scan_one(b).unwrap_or_else(|c| panic!("cut at {cut}: {c:?}"));
            assert_eq!(segs[0].groups.len(), complete, "cut at {cut}");
            let expected_end = if complete == 0 { SEGMENT_HEADER_BYTES } else { ends[complete - 1] };
            assert_eq!(segs[0].end, expected_end as u64);
        }
    }
    // A cut inside the header leaves a segment with no valid header: the end
    // of the WAL, not corruption.
    for cut in 0..SEGMENT_HEADER_BYTES {
        let segs = scan_one(&buf[..cut]).unwrap();
        assert_eq!(segs[0].header_epoch, None);
    }
}

#[test]
fn stale_frames_from_a_reused_file_are_rejected() {
    // The file held segment 3; it is reused as segment 7 with a new header.
    let (old, _) = segment_with(SegmentId(3), Epoch(1), 0, &groups());
    let mut reused = old.clone();
    reused[..SEGMENT_HEADER_BYTES].copy_from_slice(&encode_header(SEG, EPOCH));
    let segs = scan_one(&reused).unwrap();
    assert!(segs[0].groups.is_empty(), "stale groups of segment 3 must not pass as segment 7");
    assert_eq!(segs[0].end, SEGMENT_HEADER_BYTES as u64);
}

#[test]
fn stale_tail_after_a_rewritten_group_is_ignored() {
    // A writer of epoch 3 wrote three groups; only the first was committed
    // (say). After a crash, epoch 4 rewrites LSN 1 with a shorter group.
    let (mut buf, ends) = segment_with(SEG, EPOCH, 0, &groups());
    let frames = [batch(2, 0, 1)];
    let refs: Vec<&Frame> = frames.iter().collect();
    let group = encode_group(SEG, Epoch(4), Lsn(1), &refs);
    buf[ends[0]..ends[0] + group.len()].copy_from_slice(&group);
    let segs = scan_one(&buf).unwrap();
    let admitted = &segs[0].groups;
    assert_eq!(admitted.len(), 2);
    assert_eq!(admitted[1].epoch, Epoch(4));
    assert_eq!(admitted[1].frames, frames);
}

#[test]
fn a_missing_seal_before_a_later_segment_is_corruption() {
    let (first, ends) = segment_with(SegmentId(1), EPOCH, 0, &groups()[..1]);
    let (second, _) = segment_with(SegmentId(2), EPOCH, 1, &groups()[1..]);
    let c = scan(&[(SegmentId(1), &first), (SegmentId(2), &second)], false).unwrap_err();
    assert_eq!((c.segment, c.offset), (SegmentId(1), ends[0] as u64));
}

#[test]
fn sealed_segments_chain_and_a_spare_ends_the_wal() {
    let mut g = groups();
    g[0].push(Frame::Seal);
    let (first, _) = segment_with(SegmentId(1), EPOCH, 0, &g[..1]);
    let (second, _) = segment_with(SegmentId(2), EPOCH, 1, &g[1..]);
    let (spare, _) = segment_with(SegmentId(3), EPOCH, 0, &[]);
    let segs = scan(&[(SegmentId(1), &first), (SegmentId(2), &second), (SegmentId(3), &spare)], false).unwrap();
    assert!(segs[0].sealed);
    assert_eq!(segs[1].groups.len(), 2);
    assert_eq!(segs[1].groups[0].lsn, Lsn(1));
    assert!(segs[2].groups.is_empty() && segs[2].header_epoch == Some(EPOCH));
}

#[test]
fn a_gap_in_lsns_is_corruption() {
    let mut g = groups();
    g[0].push(Frame::Seal);
    let (first, _) = segment_with(SegmentId(1), EPOCH, 0, &g[..1]);
    let (second, _) = segment_with(SegmentId(2), EPOCH, 5, &g[1..]);
    let c = scan(&[(SegmentId(1), &first), (SegmentId(2), &second)], false).unwrap_err();
    assert_eq!(c.segment, SegmentId(2));
}

#[test]
fn the_byte_format_is_pinned() {
    // Changing these bytes breaks every WAL already on disk: bump
    // FORMAT_VERSION and teach the reader the old one instead.
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(
        hex(&encode_header(SegmentId(1), Epoch(2))),
        "534b505257414c0001000000e9d0b00d01000000000000000200000000000000"
    );
    let frames = [Frame::Seal];
    let refs: Vec<&Frame> = frames.iter().collect();
    assert_eq!(hex(&encode_group(SegmentId(1), Epoch(2), Lsn(3), &refs)), "00000000622742b3030000000000000002000000000000000608000000534c1a3103000000000000000200000000000000070100000019000000");
}

#[test]
fn a_rotten_header_on_the_last_segment_is_corruption_not_junk() {
    let mut g = groups();
    g[0].push(Frame::Seal);
    let (first, _) = segment_with(SegmentId(1), EPOCH, 0, &g[..1]);
    let (mut last, _) = segment_with(SegmentId(2), EPOCH, 1, &g[1..2]);
    last[3] ^= 0x40; // the magic
    let c = scan(&[(SegmentId(1), &first), (SegmentId(2), &last)], false).unwrap_err();
    assert_eq!((c.segment, c.offset), (SegmentId(2), 0));
    // A torn creation (header cut, zeros after) is still the end of the WAL.
    let (mut torn, _) = segment_with(SegmentId(2), EPOCH, 1, &[]);
    torn[10..SEGMENT_HEADER_BYTES].fill(0);
    let segs = scan(&[(SegmentId(1), &first), (SegmentId(2), &torn)], false).unwrap();
    assert_eq!(segs[1].header_epoch, None);
}

#[test]
fn a_span_is_read_back_group_by_group_and_every_bit_of_it_is_checked() {
    let groups = groups();
    let (buf, ends) = segment_with(SEG, EPOCH, 5, &groups);
    let start = SEGMENT_HEADER_BYTES;
    let end = *ends.last().unwrap();
    let span = GroupSpan { lsn: Lsn(5), last: Lsn(7), segment: SEG, offset: start as u64, len: (end - start) as u64 };
    let visit = |bytes: &[u8], span: GroupSpan, one_group: bool| {
        let mut seen = Vec::new();
        read_span_back(span, bytes, |k| k == key(0), |k, origin, p, _| seen.push((k, origin.0, p.0)), one_group)
            .map(|()| seen)
    };
    let all = visit(&buf[start..end], span, false).unwrap();
    let expected = vec![(key(0), 0, 0), (key(0), 0, 1), (key(0), 0, 2), (key(0), 5, 5)];
    assert_eq!(all, expected);
    // The planted bug keeps the first group's records only.
    assert_eq!(visit(&buf[start..end], span, true).unwrap(), expected[..3].to_vec());
    // One group is a span of one.
    let first = GroupSpan { last: Lsn(5), len: (ends[0] - start) as u64, ..span };
    assert_eq!(visit(&buf[start..ends[0]], first, false).unwrap().len(), 3);
    // Another last LSN, another length, or any bit flipped: nothing is visited.
    for wrong in
        [GroupSpan { last: Lsn(6), ..span }, GroupSpan { last: Lsn(8), ..span }, GroupSpan { lsn: Lsn(6), ..span }]
    {
        assert!(visit(&buf[start..end], wrong, false).is_err(), "{wrong:?}");
    }
    assert!(visit(&buf[start..end - 1], GroupSpan { len: span.len - 1, ..span }, false).is_err());
    for bit in (0..(end - start) * 8).step_by(7) {
        let mut bytes = buf[start..end].to_vec();
        bytes[bit / 8] ^= 1 << (bit % 8);
        let err = visit(&bytes, span, false).expect_err("a flipped bit fails the span");
        let at =
            ends.iter().map(|e| *e as u64).filter(|e| *e <= (start + bit / 8) as u64).max().unwrap_or(start as u64);
        assert_eq!(err.offset, at, "the failing group's offset, bit {bit}");
    }
}

#[test]
fn spans_reach_later_groups_of_their_block_and_merge_where_they_share_one() {
    let place = |lsn: u64, offset: u64| GroupPlace { lsn: Lsn(lsn), segment: SEG, offset, len: 100 };
    let mut a = GroupSpan::of(place(1, 100));
    assert!(a.reach(place(1, 100), 1000), "its own last group");
    assert!(a.reach(place(3, 300), 1000));
    assert_eq!((a.last, a.len), (Lsn(3), 300));
    assert!(!a.reach(place(2, 200), 1000), "an earlier group");
    assert!(!a.reach(place(4, 1000), 1000), "a group of the next block");
    assert!(!a.reach(GroupPlace { segment: SegmentId(8), ..place(4, 400) }, 1000), "another segment");
    let mut b = GroupSpan::of(place(3, 300));
    assert!(b.reach(place(5, 500), 1000));
    assert!(a.merge(&b));
    assert_eq!(a, GroupSpan { lsn: Lsn(1), last: Lsn(5), segment: SEG, offset: 100, len: 500 });
    assert!(!a.merge(&GroupSpan::of(place(6, 600))), "no group shared");
}

#[test]
fn provisional_batches_and_window_ends_round_trip() {
    let key = PartitionKey { source: SourceId(1), partition: 2 };
    let records = vec![Record { position: Position(5), bytes: b"{}".to_vec() }];
    let batch = SourceBatch {
        key,
        stream: StreamId(0),
        end: Position(6),
        checkpoint: None,
        records,
        counted: None,
        provisional: true,
    };
    let whole = SourceBatch { provisional: false, ..batch.clone() };
    assert_eq!(Frame::SourceBatch(batch.clone()).encoded_len(), Frame::SourceBatch(whole.clone()).encoded_len());
    let part = WindowPart { partition: 2, stream: StreamId(0), from: Position(5), to: Position(6), records: 1 };
    let tail = Tail { partition: 2, key: 7, digests: vec![42], more: false };
    let close = WindowEnd {
        source: SourceId(1),
        checkpoint: Some(b"state".to_vec()),
        closed: true,
        parts: vec![part],
        tails: vec![tail],
    };
    let void = WindowEnd { checkpoint: None, closed: false, tails: Vec::new(), ..close.clone() };
    let frames = vec![Frame::SourceBatch(batch), Frame::SourceBatch(whole), Frame::Window(close), Frame::Window(void)];
    let (buf, _) = segment_with(SEG, EPOCH, 0, std::slice::from_ref(&frames));
    assert_eq!(scan_one(&buf).unwrap()[0].groups[0].frames, frames);
}
