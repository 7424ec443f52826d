//! The stop record round-trips, rebuilds what a scan rebuilds, passes its
//! checks on the WAL it describes and fails them on one that changed, and
//! refuses damaged bytes.

use super::*;
use crate::recovery::recover;
use crate::wal::{encode_group, encode_header, Frame, Names, Record, SourceBatch};

const SIZE: usize = 8192;
const EPOCH: Epoch = Epoch(5 << 32 | 9);

fn batch(p: u32, from: u64, n: u64) -> Frame {
    let records = (from..from + n).map(|i| Record { position: Position(i), bytes: vec![i as u8; 20] }).collect();
    Frame::SourceBatch(SourceBatch {
        key: PartitionKey { source: SourceId(0), partition: p },
        stream: StreamId(0),
        end: Position(from + n),
        checkpoint: None,
        records,
        counted: None,
        provisional: false,
    })
}

/// Two segments: the first sealed, the second active; and a spare.
fn wal() -> Vec<(SegmentId, Vec<u8>)> {
    let groups: [(u64, Vec<Frame>); 4] = [
        (0, vec![Frame::Fence, batch(0, 0, 3)]),
        (0, vec![batch(1, 0, 2), Frame::Seal]),
        (1, vec![batch(0, 3, 4)]),
        (1, vec![batch(1, 2, 1)]),
    ];
    let mut segments: Vec<(SegmentId, Vec<u8>)> =
        (0..3).map(|i| (SegmentId(i), encode_header(SegmentId(i), EPOCH))).collect();
    for (lsn, (seg, frames)) in groups.iter().enumerate() {
        let refs: Vec<&Frame> = frames.iter().collect();
        let bytes = encode_group(SegmentId(*seg), EPOCH, Lsn(lsn as u64), &refs);
        segments[*seg as usize].1.extend(bytes);
    }
    for (_, b) in &mut segments {
        b.resize(SIZE, 0);
    }
    segments
}

fn record_of(segments: &[(SegmentId, Vec<u8>)]) -> StopRecord {
    let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(id, b)| (*id, b.as_slice())).collect();
    let r = recover(&refs, false, false).expect("a valid WAL");
    StopRecord {
        config: Names { sources: vec!["src".into()], sinks: vec!["a".into(), "b".into()], streams: vec!["s".into()] },
        state: r.state,
        epoch: r.epoch_max,
        next_lsn: r.next_lsn,
        next_segment: r.next_segment,
        active: r.active,
        spares: r.spares.into(),
        segments: r.segments.into(),
        held: r.records.held(),
        raft: None,
    }
}

/// The first check that fails on `segments`, if any.
fn first_mismatch(record: &StopRecord, segments: &[(SegmentId, Vec<u8>)]) -> Option<&'static str> {
    record.checks().iter().find_map(|check| {
        let at = check.read();
        let bytes = &segments.iter().find(|(id, _)| *id == at.segment).expect("listed").1;
        let from = (at.offset as usize).min(bytes.len());
        check.mismatch(&bytes[from..(from + at.len).min(bytes.len())])
    })
}

#[test]
fn a_record_round_trips_and_rebuilds_what_a_scan_rebuilds() {
    let segments = wal();
    let record = record_of(&segments);
    assert_eq!(record.listing(), vec![SegmentId(0), SegmentId(1), SegmentId(2)]);
    assert_eq!(record.held.len(), 4, "every batch is held: no sink acknowledged any");
    let decoded = StopRecord::decode(&record.encode()).expect("decodes");
    assert_eq!(decoded, record);
    let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(id, b)| (*id, b.as_slice())).collect();
    let scanned = recover(&refs, false, false).unwrap();
    let rebuilt = decoded.into_recovered(RecordLimits { cache_bytes: 0, run_records: u64::MAX });
    assert_eq!(rebuilt.state, scanned.state);
    assert_eq!(rebuilt.segments, scanned.segments);
    assert_eq!((rebuilt.active, rebuilt.spares.clone()), (scanned.active, scanned.spares.clone()));
    assert_eq!(
        (rebuilt.next_lsn, rebuilt.next_segment, rebuilt.epoch_max),
        (scanned.next_lsn, scanned.next_segment, scanned.epoch_max)
    );
    assert_eq!(rebuilt.records.held(), scanned.records.held());
    assert_eq!((rebuilt.records.len(), rebuilt.records.bytes()), (scanned.records.len(), scanned.records.bytes()));
    assert_eq!(rebuilt.records.cached_bytes(), 0, "no record comes from the stop record");
}

#[test]
fn the_checks_pass_on_the_wal_described_and_fail_on_one_that_changed() {
    let segments = wal();
    let record = record_of(&segments);
    assert_eq!(first_mismatch(&record, &segments), None);
    // A later run appended to the active segment.
    let mut appended = segments.clone();
    let (_, end) = record.active.unwrap();
    let group = encode_group(SegmentId(1), Epoch(EPOCH.0 + (1 << 32)), record.next_lsn, &[&Frame::Fence]);
    appended[1].1[end as usize..end as usize + group.len()].copy_from_slice(&group);
    assert_eq!(first_mismatch(&record, &appended), Some("bytes were written after the WAL's end the record names"));
    // ... or into the spare.
    let mut spare = segments.clone();
    let group = encode_group(SegmentId(2), EPOCH, record.next_lsn, &[&Frame::Fence]);
    spare[2].1[SEGMENT_HEADER_BYTES..SEGMENT_HEADER_BYTES + group.len()].copy_from_slice(&group);
    assert!(first_mismatch(&record, &spare).is_some());
    // A segment replaced by one that ends elsewhere.
    let mut replaced = segments.clone();
    let last = record.segments[0].last;
    replaced[0].1[last.offset as usize..].fill(0);
    assert_eq!(first_mismatch(&record, &replaced), Some("a segment's last group is not where the stop record has it"));
    // A header gone bad.
    let mut header = segments.clone();
    header[0].1[3] ^= 1;
    assert_eq!(first_mismatch(&record, &header), Some("a segment's header is not the one it names"));
    // A segment's file shortened to nothing after its header.
    let mut short = segments;
    short[1].1.truncate(SEGMENT_HEADER_BYTES);
    assert!(first_mismatch(&record, &short).is_some());
}

#[test]
fn a_damaged_record_is_refused() {
    let bytes = record_of(&wal()).encode();
    for at in 0..bytes.len() {
        for bit in [0, 5] {
            let mut b = bytes.clone();
            b[at] ^= 1 << bit;
            assert!(StopRecord::decode(&b).is_err(), "a flip at byte {at} bit {bit} is noticed");
        }
    }
    for len in 0..bytes.len() {
        assert!(StopRecord::decode(&bytes[..len]).is_err(), "cut at {len}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(StopRecord::decode(&longer).is_err());
}

/// The record of a clustered host whose commit index is 2: raft's log of
/// the four groups, with `term` as the last one's term.
fn clustered_record(segments: &[(SegmentId, Vec<u8>)], term: u64) -> StopRecord {
    use crate::consensus::entry::LogEnd;
    let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(id, b)| (*id, b.as_slice())).collect();
    let scanned = crate::wal::scan(&refs, false).unwrap();
    let ends: Vec<LogEnd> = scanned
        .iter()
        .flat_map(|s| s.groups.iter().enumerate().map(move |(i, g)| (s, i, g)))
        .map(|(s, i, g)| LogEnd {
            lsn: g.lsn,
            segment: s.id,
            end: g.end,
            sealed: s.sealed && i + 1 == s.groups.len(),
            segment_bytes: SIZE as u64,
        })
        .collect();
    let mut runs = vec![(0, EPOCH.0)];
    if term != EPOCH.0 {
        runs.push((3, term));
    }
    let log =
        LogRecord { base: (0, EPOCH.0), base_end: ends[0], ends: ends[1..].to_vec(), runs, header_epochs: vec![] };
    StopRecord { raft: Some(RaftRecord { commit: 2, log }), ..record_of(segments) }
}

#[test]
fn a_clustered_record_keeps_raft_s_log_and_checks_its_groups_past_the_commit_index() {
    let segments = wal();
    let record = clustered_record(&segments, EPOCH.0);
    assert_eq!(StopRecord::decode(&record.encode()), Ok(record.clone()));
    assert!(record.matches_commit(2) && !record.matches_commit(3));
    let mut ahead = record.clone();
    ahead.raft.as_mut().unwrap().commit = 4;
    assert!(StopRecord::decode(&ahead.encode()).is_err(), "a commit index past the log's last group");
    let entries: Vec<u64> = record
        .checks()
        .iter()
        .filter_map(|c| match c {
            Check::Entry { place, .. } => Some(place.lsn.0),
            _ => None,
        })
        .collect();
    assert_eq!(entries, vec![3], "the group past the commit index, also the last");
    assert_eq!(first_mismatch(&record, &segments), None);
    // The same place and index under another term: another log.
    let other = clustered_record(&segments, EPOCH.0 + 1);
    assert_eq!(
        first_mismatch(&other, &segments),
        Some("a group of raft's log is not the one the stop record has at its place")
    );
}
