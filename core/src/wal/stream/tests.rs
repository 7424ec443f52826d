//! The streaming scan decides what `scan` decides over whole segments, at
//! every window size: generated WALs (sealed segments, a preallocated
//! active one, spares, a stale writer's group) damaged at random (bit
//! flips, cut files, zeroed runs, lost segments, rotten headers), each
//! scanned both ways and compared.

use super::*;
use crate::records::RecordLimits;
use crate::wal::scan::SEGMENTS_MISSING;
use whole::scan;

/// A seeded xorshift: no OS randomness in core's tests either.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn batch(r: &mut Rng, p: u32, from: u64) -> Frame {
    let n = 1 + r.below(6);
    let records =
        (from..from + n).map(|i| Record { position: Position(i), bytes: vec![b'x'; r.below(200) as usize] }).collect();
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

/// Sorted segment files: `sealed` full ones, an active one preallocated
/// with zeros after its last group, then `spares` holding only a header.
fn wal(r: &mut Rng) -> Vec<(SegmentId, Vec<u8>)> {
    let size = 2048 + r.below(2048) as usize;
    let epoch = Epoch(5);
    let (mut lsn, mut pos) = (0u64, 0u64);
    let first = r.below(3);
    let mut segments = Vec::new();
    let sealed = r.below(4);
    for s in 0..=sealed {
        let id = SegmentId(first + s);
        let mut bytes = encode_header(id, epoch);
        let groups = r.below(5);
        for g in 0..=groups {
            let seal = s < sealed && g == groups;
            let mut frames = vec![batch(r, 0, pos)];
            pos += 10;
            if r.below(3) == 0 {
                frames.push(Frame::Fence);
            }
            if seal {
                frames.push(Frame::Seal);
            }
            let refs: Vec<&Frame> = frames.iter().collect();
            // Now and then a stale writer's group lands first (an older epoch).
            if r.below(8) == 0 {
                bytes.extend(encode_group(id, Epoch(1), Lsn(lsn), &refs));
            }
            bytes.extend(encode_group(id, epoch, Lsn(lsn), &refs));
            lsn += 1;
        }
        if s == sealed {
            bytes.resize(bytes.len().max(size), 0);
        }
        segments.push((id, bytes));
    }
    for k in 0..r.below(3) {
        let id = SegmentId(first + sealed + 1 + k);
        let mut bytes = encode_header(id, epoch);
        bytes.resize(size, 0);
        segments.push((id, bytes));
    }
    segments
}

fn damage(r: &mut Rng, segments: &mut Vec<(SegmentId, Vec<u8>)>) {
    for _ in 0..r.below(3) {
        let s = r.below(segments.len() as u64) as usize;
        let count = segments.len();
        let bytes = &mut segments[s].1;
        match r.below(6) {
            0 | 1 if !bytes.is_empty() => {
                let at = r.below(bytes.len() as u64) as usize;
                bytes[at] ^= 1 << r.below(8);
            }
            2 => {
                let len = r.below(bytes.len() as u64 + 1) as usize;
                bytes.truncate(len);
            }
            3 if !bytes.is_empty() => {
                let at = r.below(bytes.len() as u64) as usize;
                let end = (at + r.below(300) as usize).min(bytes.len());
                bytes[at..end].fill(0);
            }
            4 if count > 1 => {
                segments.remove(s);
            }
            _ => {
                if bytes.len() >= 16 {
                    bytes[15] ^= 0x40; // the header's checksum
                }
            }
        }
    }
}

/// Runs the streaming scan over in-memory files, reassembling what it
/// hands out into `scan`'s shape.
fn stream(segments: &[(SegmentId, &[u8])], lenient: bool, window: usize) -> Result<Vec<ScannedSegment>, Corruption> {
    let mut s = StreamScan::new(segments.iter().map(|(id, _)| *id).collect(), lenient, window);
    let (mut out, mut groups) = (Vec::new(), Vec::new());
    let mut reads = 0;
    while let Some(read) = s.next_read() {
        reads += 1;
        assert!(reads < 1_000_000, "the scan moves on");
        let bytes = segments.iter().find(|(id, _)| *id == read.segment).expect("listed").1;
        let from = (read.offset as usize).min(bytes.len());
        let to = (from + read.len).min(bytes.len());
        for item in s.feed(bytes[from..to].to_vec())? {
            match item {
                Scanned::Group(_, g) => groups.push(g),
                Scanned::Segment(mut seg) => {
                    seg.groups = std::mem::take(&mut groups);
                    out.push(seg);
                }
                Scanned::Bytes(_) => unreachable!("not asked for"),
            }
        }
    }
    assert!(groups.is_empty(), "every group belongs to a segment handed out after it");
    // Each read moves on by about a window, or by a group larger than one.
    let total: usize = segments.iter().map(|(_, b)| b.len()).sum();
    let bound = 2 * total / s.window + total / COMMIT_FRAME_BYTES + 4 * segments.len() + 4;
    assert!(reads <= bound, "{reads} reads of {total} bytes in windows of {window}");
    Ok(out)
}

fn same(segments: &[(SegmentId, Vec<u8>)], lenient: bool, window: usize, case: &str) {
    let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(id, b)| (*id, b.as_slice())).collect();
    let whole = format!("{:?}", scan(&refs, lenient));
    let streamed = format!("{:?}", stream(&refs, lenient, window));
    assert_eq!(streamed, whole, "{case}, window {window}");
}

#[test]
fn the_streaming_scan_decides_what_the_whole_scan_does_at_every_window() {
    let mut outcomes = std::collections::BTreeSet::new();
    for seed in 1..1500u64 {
        let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut segments = wal(&mut r);
        if seed % 5 != 0 {
            damage(&mut r, &mut segments);
        }
        let lenient = seed % 7 == 0;
        for window in [1, 33, 97, 500, 1 << 20] {
            same(&segments, lenient, window, &format!("seed {seed}"));
        }
        let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(id, b)| (*id, b.as_slice())).collect();
        outcomes.insert(match scan(&refs, lenient) {
            Ok(_) => "admitted",
            Err(c) => c.what,
        });
    }
    // The generator reaches every way a scan ends.
    assert!(outcomes.len() >= 4, "{outcomes:?}");
}

#[test]
fn an_empty_listing_is_done_at_once() {
    let s = StreamScan::new(Vec::new(), false, 64);
    assert!(s.is_done());
    assert_eq!(s.next_read(), None);
}

#[test]
fn a_group_larger_than_the_window_is_read_whole() {
    let mut r = Rng(3);
    let id = SegmentId(0);
    let mut bytes = encode_header(id, Epoch(1));
    let frames: Vec<Frame> = (0..40).map(|i| batch(&mut r, 0, i * 10)).collect();
    let refs: Vec<&Frame> = frames.iter().collect();
    bytes.extend(encode_group(id, Epoch(1), Lsn(0), &refs));
    let segments = vec![(id, bytes)];
    same(&segments, false, 64, "one big group");
    let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(id, b)| (*id, b.as_slice())).collect();
    assert_eq!(stream(&refs, false, 64).unwrap()[0].groups.len(), 1);
}

#[test]
fn with_nothing_admitted_only_a_higher_lsn_after_the_failure_is_corruption() {
    let mut r = Rng(9);
    let id = SegmentId(0);
    let frames = [batch(&mut r, 0, 0)];
    let refs: Vec<&Frame> = frames.iter().collect();
    // A stale writer's copy of LSN 0, torn, then the live copy of LSN 0.
    let mut bytes = encode_header(id, Epoch(5));
    let stale = encode_group(id, Epoch(1), Lsn(0), &refs);
    let torn_at = bytes.len() + 30;
    bytes.extend(&stale);
    bytes[torn_at] ^= 1;
    bytes.extend(encode_group(id, Epoch(5), Lsn(0), &refs));
    bytes.resize(2048, 0);
    let mut segments = vec![(id, bytes.clone())];
    same(&segments, false, 64, "the same LSN again");
    let refs_: Vec<(SegmentId, &[u8])> = segments.iter().map(|(id, b)| (*id, b.as_slice())).collect();
    assert!(stream(&refs_, false, 64).is_ok(), "copies of one LSN are not a later group");
    // LSN 1 after them proves the failure was not the WAL's end.
    let frames = [batch(&mut r, 0, 10)];
    let refs: Vec<&Frame> = frames.iter().collect();
    let at = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
    let next = encode_group(id, Epoch(5), Lsn(1), &refs);
    bytes[at..at + next.len()].copy_from_slice(&next);
    segments[0].1 = bytes;
    same(&segments, false, 64, "a later LSN");
    let refs_: Vec<(SegmentId, &[u8])> = segments.iter().map(|(id, b)| (*id, b.as_slice())).collect();
    assert!(stream(&refs_, false, 64).is_err());
}

/// Recovery as it was before it streamed: the whole scan, then the
/// rebuild, and the gap found by scanning again around the jump.
fn recover_whole(
    segments: &[(SegmentId, &[u8])],
    lenient: bool,
    trust: bool,
) -> Result<crate::recovery::RecoveredWal, crate::recovery::WalDamage> {
    use crate::recovery::{rebuild, Missing, WalDamage};
    match scan(segments, lenient) {
        Ok(scanned) => rebuild(scanned, !trust),
        Err(c) if c.what == SEGMENTS_MISSING && trust => {
            let from = segments.iter().position(|(id, _)| *id == c.segment).unwrap();
            recover_whole(&segments[from..], lenient, true)
        }
        Err(c) if c.what == SEGMENTS_MISSING => {
            let at = segments.iter().position(|(id, _)| *id == c.segment).unwrap();
            let prefix = scan(&segments[..at], false).unwrap();
            let last = prefix.iter().rev().find_map(|s| s.groups.last().map(|g| (s.id, g.lsn)));
            // The one change: the whole scan scanned that segment again
            // alone and lost the LSN its first group carries when a later
            // group of it was damaged; the streaming scan read that first
            // group and names it.
            let (id, bytes) = segments[at];
            let first =
                read_group(id, bytes, SEGMENT_HEADER_BYTES, None, true, RecordMode::Owned).ok().map(|(g, _)| g.lsn);
            let (after, lsns) = match (last, first) {
                (Some((after, a)), Some(b)) => (after, Some((Lsn(a.0 + 1), Lsn(b.0 - 1)))),
                (Some((after, _)), None) => (after, None),
                (None, _) => (SegmentId(c.segment.0.saturating_sub(1)), None),
            };
            Err(WalDamage::Missing(Missing::Gap { after, before: c.segment, lsns }))
        }
        Err(c) => Err(WalDamage::Corrupt(c)),
    }
}

#[test]
fn streaming_recovery_rebuilds_what_whole_recovery_did() {
    let mut outcomes = std::collections::BTreeMap::new();
    for seed in 1..1500u64 {
        let mut r = Rng(seed.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1);
        let mut segments = wal(&mut r);
        if seed % 5 != 0 {
            damage(&mut r, &mut segments);
        }
        let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(id, b)| (*id, b.as_slice())).collect();
        let (lenient, trust) = (seed % 7 == 0, seed % 3 == 0);
        let whole = recover_whole(&refs, lenient, trust);
        let streamed = crate::recovery::recover(&refs, lenient, trust);
        assert_eq!(format!("{streamed:?}"), format!("{whole:?}"), "seed {seed}");
        let outcome = match &whole {
            Ok(_) => "recovered".to_string(),
            Err(e) => format!("{e:?}").chars().take(12).collect(),
        };
        *outcomes.entry(outcome).or_insert(0) += 1;
    }
    assert!(outcomes.len() >= 3, "{outcomes:?}");
}

/// With a small record cache the rebuild reads most batches counted, not
/// decoded: the committed state and every record held (how many, their
/// bytes, per partition) are what decoding every record gives, and no more
/// than the cache's bytes stay in memory.
#[test]
fn a_full_cache_counts_records_and_holds_the_same_ones() {
    use crate::recovery::Recovery;
    let mut counted = 0;
    for seed in 1..300u64 {
        let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let segments = wal(&mut r);
        let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(id, b)| (*id, b.as_slice())).collect();
        let Ok(all) = crate::recovery::recover(&refs, false, false) else { continue };
        for cache in [0, 40, 400] {
            let listed = refs.iter().map(|(id, _)| *id).collect();
            let mut rec = Recovery::new(listed, false, false, 33 + (seed as usize * 7) % 300)
                .with_record_cache(RecordLimits { cache_bytes: cache, run_records: 5 }, 0);
            while let Some(read) = rec.next_read() {
                let bytes = refs.iter().find(|(id, _)| *id == read.segment).unwrap().1;
                let from = (read.offset as usize).min(bytes.len());
                rec.feed(bytes[from..(from + read.len).min(bytes.len())].to_vec()).unwrap();
            }
            let got = rec.finish().unwrap();
            assert_eq!(format!("{:?}", got.state), format!("{:?}", all.state), "seed {seed}");
            assert_eq!((got.records.len(), got.records.bytes()), (all.records.len(), all.records.bytes()));
            assert!(got.records.cached_bytes() <= cache, "seed {seed}: {}", got.records.cached_bytes());
            for key in all.state.partitions.keys() {
                let whole = |s: &crate::records::RecordStore| s.take(*key, Position(0), Position(u64::MAX), usize::MAX);
                assert_eq!(whole(&got.records), whole(&all.records), "seed {seed}");
            }
            counted += (got.records.cached_bytes() < all.records.cached_bytes()) as u32;
        }
    }
    assert!(counted > 100, "{counted} recoveries left records out of memory");
}

/// The whole-segment scan as it was before the scan streamed, kept as the
/// oracle the streaming scan is held to.
mod whole {
    use crate::ids::*;
    use crate::wal::frame::*;
    use crate::wal::scan::{read_torn_group, SEGMENTS_MISSING};
    use crate::wal::segment::*;

    pub fn scan(segments: &[(SegmentId, &[u8])], lenient_tail: bool) -> Result<Vec<ScannedSegment>, Corruption> {
        let mut scan = Scan { segments, lenient_tail, expected: None, newest: Epoch(0), ended: false };
        (0..segments.len()).map(|i| scan.segment(i)).collect()
    }

    /// Where a scan stands between segments.
    struct Scan<'a> {
        segments: &'a [(SegmentId, &'a [u8])],
        lenient_tail: bool,
        /// The LSN the next group must carry.
        expected: Option<Lsn>,
        /// The highest writer epoch admitted so far.
        newest: Epoch,
        /// The WAL has ended: what follows is read as nothing.
        ended: bool,
    }

    impl Scan<'_> {
        fn segment(&mut self, i: usize) -> Result<ScannedSegment, Corruption> {
            let (id, bytes) = self.segments[i];
            let end = SEGMENT_HEADER_BYTES as u64;
            let mut seg =
                ScannedSegment { id, header_epoch: None, groups: Vec::new(), sealed: false, end, stale_groups: 0 };
            match decode_header(id, bytes) {
                Ok(epoch) => seg.header_epoch = Some(epoch),
                Err(_) => {
                    // A torn creation holds zeros after its header, never a
                    // valid commit record of this segment: one means the header
                    // rotted under committed data.
                    if !self.ended && (holds_commit(id, bytes) || commit_follows(self.segments, i, 0, self.expected)) {
                        return Err(Corruption { segment: id, offset: 0, what: "segment header is invalid" });
                    }
                    self.ended = true;
                }
            }
            if !self.ended {
                seg.end = self.groups(i, &mut seg)? as u64;
            }
            Ok(seg)
        }

        /// Admits the segment's groups; returns where the next would go.
        fn groups(&mut self, i: usize, seg: &mut ScannedSegment) -> Result<usize, Corruption> {
            let (id, bytes) = self.segments[i];
            let mut pos = SEGMENT_HEADER_BYTES;
            loop {
                let read = read_group(id, bytes, pos, None, true, RecordMode::Owned);
                // A group of a writer older than one already admitted was written
                // by a writer that lost the lease and had not noticed: it is not
                // the WAL's, and the new writer continues after it.
                if let Ok((group, _)) = &read {
                    if group.epoch < self.newest {
                        pos = group.end as usize;
                        seg.stale_groups += 1;
                        continue;
                    }
                }
                // A valid first group whose LSN jumps past the sealed segment
                // before it: whole segments in between are gone.
                if let (Ok((group, _)), Some(e)) = (&read, self.expected) {
                    if pos == SEGMENT_HEADER_BYTES && group.lsn > e {
                        return Err(Corruption { segment: id, offset: pos as u64, what: SEGMENTS_MISSING });
                    }
                }
                let read = read.and_then(|(g, sealed)| match self.expected {
                    Some(e) if e != g.lsn => Err(GroupError::Invalid),
                    _ => Ok((g, sealed)),
                });
                let Ok((group, sealed)) = read else {
                    return self.torn(i, seg, pos);
                };
                self.newest = self.newest.max(group.epoch);
                self.expected = Some(Lsn(group.lsn.0 + 1));
                pos = group.end as usize;
                seg.groups.push(group);
                if sealed {
                    seg.sealed = true;
                    return Ok(pos);
                }
            }
        }

        /// The group at `pos` does not validate: the end of the WAL, unless a
        /// committed group follows it (then it is corruption).
        fn torn(&mut self, i: usize, seg: &mut ScannedSegment, mut pos: usize) -> Result<usize, Corruption> {
            let (id, bytes) = self.segments[i];
            if commit_follows(self.segments, i, pos, self.expected) {
                let what = "a commit group fails validation and later groups are committed";
                return Err(Corruption { segment: id, offset: pos as u64, what });
            }
            if self.lenient_tail {
                if let Some(group) = read_torn_group(id, bytes, pos, self.expected) {
                    pos = group.end as usize;
                    seg.groups.push(group);
                }
            }
            self.ended = true;
            Ok(pos)
        }
    }

    /// Does `bytes` hold any checksum-valid commit record of `segment`?
    fn holds_commit(segment: SegmentId, bytes: &[u8]) -> bool {
        (SEGMENT_HEADER_BYTES..bytes.len().saturating_sub(COMMIT_FRAME_BYTES - 1))
            .any(|at| bytes[at] == COMMIT_PAYLOAD_BYTES as u8 && commit_record_at(segment, &bytes[at..]).is_some())
    }

    /// Is there a valid commit record of a later group after `pos` in segment
    /// `i`, or anywhere in a later segment? With no group admitted yet, "later"
    /// means a second, higher LSN after the first one found.
    fn commit_follows(segments: &[(SegmentId, &[u8])], i: usize, pos: usize, expected: Option<Lsn>) -> bool {
        let mut lowest: Option<Lsn> = None;
        for (j, &(id, bytes)) in segments.iter().enumerate().skip(i) {
            let start = if j == i { pos + 1 } else { SEGMENT_HEADER_BYTES };
            let mut at = start;
            while at + COMMIT_FRAME_BYTES <= bytes.len() {
                // A commit record starts with its length, 8: jump to the next 8.
                match memchr::memchr(COMMIT_PAYLOAD_BYTES as u8, &bytes[at..bytes.len() - COMMIT_FRAME_BYTES + 1]) {
                    Some(skip) => at += skip,
                    None => break,
                }
                if let Some(lsn) = commit_record_at(id, &bytes[at..]) {
                    match expected {
                        Some(e) if lsn > e => return true,
                        Some(_) => {}
                        None => match lowest {
                            Some(low) if lsn > low => return true,
                            Some(_) => {}
                            None => lowest = Some(lsn),
                        },
                    }
                }
                at += 1;
            }
        }
        false
    }
}
