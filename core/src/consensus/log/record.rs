//! Part of `Log`: what a clustered host's stop record keeps of raft's log,
//! so that a start after a stop on SIGTERM need not scan the segments to
//! learn it: where the log begins, each group's end, the terms as runs,
//! and the header epoch of each segment a group of the log opened. The
//! entries are not in it: those past the commit index are read back from
//! their places at the start (and checked there), as a scan would have
//! kept them.

use super::*;
use crate::wal::codec::{DecodeError, Reader, Writer};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    pub base: (u64, u64),
    pub base_end: LogEnd,
    /// The end of the log after each index past `base`, oldest first.
    pub ends: Vec<LogEnd>,
    /// (first index, term) of each term's run from `base` on.
    pub runs: Vec<(u64, u64)>,
    pub header_epochs: Vec<(SegmentId, Epoch)>,
}

impl LogRecord {
    pub fn last_index(&self) -> u64 {
        self.base.0 + self.ends.len() as u64
    }

    fn end_after(&self, index: u64) -> LogEnd {
        match index == self.base.0 {
            true => self.base_end,
            false => self.ends[(index - self.base.0 - 1) as usize],
        }
    }

    /// Where the group at `index` (past the base) lies.
    pub fn place(&self, index: u64) -> GroupPlace {
        place_between(index, self.end_after(index - 1), self.end_after(index))
    }

    /// Every segment holding a group of the log, in order.
    pub fn segments(&self) -> Vec<SegmentId> {
        let mut ids: Vec<SegmentId> = std::iter::once(&self.base_end).chain(&self.ends).map(|e| e.segment).collect();
        ids.dedup();
        ids
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        w.u64(self.base.0);
        w.u64(self.base.1);
        put_end(w, &self.base_end);
        w.u32(self.ends.len() as u32);
        for e in &self.ends {
            put_end(w, e);
        }
        w.u32(self.runs.len() as u32);
        for &(first, term) in &self.runs {
            w.u64(first);
            w.u64(term);
        }
        w.u32(self.header_epochs.len() as u32);
        for (id, epoch) in &self.header_epochs {
            w.u64(id.0);
            w.u64(epoch.0);
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<LogRecord, DecodeError> {
        let base = (r.u64()?, r.u64()?);
        let base_end = get_end(r)?;
        let ends = (0..r.count(33)?).map(|_| get_end(r)).collect::<Result<Vec<_>, _>>()?;
        let runs = (0..r.count(16)?).map(|_| Ok((r.u64()?, r.u64()?))).collect::<Result<Vec<_>, _>>()?;
        let header_epochs =
            (0..r.count(16)?).map(|_| Ok((SegmentId(r.u64()?), Epoch(r.u64()?)))).collect::<Result<Vec<_>, _>>()?;
        let record = LogRecord { base, base_end, ends, runs, header_epochs };
        record.consistent().then_some(record).ok_or(DecodeError)
    }

    /// The indexes follow one another, each group ends inside its segment
    /// and after the one before it (so every place has a length), and the
    /// runs cover them, terms rising: what `Log::recorded` and `place`
    /// rely on.
    fn consistent(&self) -> bool {
        let all = || std::iter::once(&self.base_end).chain(&self.ends);
        let ends_follow = all().enumerate().all(|(i, e)| e.lsn.0 == self.base.0 + i as u64);
        let inside = all().all(|e| e.end > crate::wal::SEGMENT_HEADER_BYTES as u64 && e.end <= e.segment_bytes);
        let placed = all().zip(&self.ends).all(|(a, b)| match a.segment == b.segment {
            true => a.end < b.end,
            false => a.segment < b.segment,
        });
        let runs_rise = self.runs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1);
        let runs_cover = self.runs.first() == Some(&(self.base.0, self.base.1))
            && self.runs.last().is_some_and(|r| r.0 <= self.last_index());
        ends_follow && inside && placed && runs_rise && runs_cover
    }

    /// The term of `index`, within the log.
    pub fn term(&self, index: u64) -> u64 {
        let at = self.runs.partition_point(|&(first, _)| first <= index);
        self.runs[at - 1].1
    }
}

fn put_end(w: &mut Writer<'_>, e: &LogEnd) {
    for v in [e.lsn.0, e.segment.0, e.end] {
        w.u64(v);
    }
    w.u8(e.sealed as u8);
    w.u64(e.segment_bytes);
}

fn get_end(r: &mut Reader<'_>) -> Result<LogEnd, DecodeError> {
    let (lsn, segment, end) = (Lsn(r.u64()?), SegmentId(r.u64()?), r.u64()?);
    let sealed = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(DecodeError),
    };
    Ok(LogEnd { lsn, segment, end, sealed, segment_bytes: r.u64()? })
}

impl Log {
    /// What a stop record keeps of this log.
    pub fn record(&self) -> LogRecord {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for index in self.base.0..=self.last_index() {
            let term = self.term_of(index).expect("the log holds every index from its base");
            if runs.last().is_none_or(|&(_, t)| t != term) {
                runs.push((index, term));
            }
        }
        LogRecord {
            base: self.base,
            base_end: self.base_end,
            ends: self.ends.iter().copied().collect(),
            runs,
            // Only the segments a group of the log opened, as a scan finds
            // them (the base's own opener is before the log).
            header_epochs: self
                .header_epochs
                .iter()
                .filter(|(s, _)| **s > self.base_end.segment)
                .map(|(s, e)| (*s, *e))
                .collect(),
        }
    }

    /// The log a stop record kept, under the hard state and membership
    /// saved last (its commit index raised to the first group on disk, as
    /// a scan's log does), holding no entries yet: `finish_restore` takes
    /// the bytes of the groups past the commit index, read back from
    /// `place`.
    pub fn recorded(mut hard: HardState, conf: ConfState, record: LogRecord) -> Log {
        hard.commit = super::commit_on_disk(hard.commit, record.base.0);
        let mut log = Log::new(hard, conf, record.base, record.base_end);
        for end in record.ends.iter() {
            log.terms.push(end.lsn.0, record.term(end.lsn.0));
            log.ends.push_back(*end);
        }
        log.header_epochs = record.header_epochs.into_iter().collect();
        log
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::SEGMENT_HEADER_BYTES;

    fn end(lsn: u64, segment: u64, end: u64, sealed: bool) -> LogEnd {
        LogEnd { lsn: Lsn(lsn), segment: SegmentId(segment), end, sealed, segment_bytes: 4096 }
    }

    /// Indexes 5..=9: 5 (the base) to 7 in segment 1 (7 seals it), 8 and 9
    /// in segment 2; terms 2, 2, 2, 3, 3.
    fn record() -> LogRecord {
        LogRecord {
            base: (5, 2),
            base_end: end(5, 1, 300, false),
            ends: vec![end(6, 1, 400, false), end(7, 1, 500, true), end(8, 2, 132, false), end(9, 2, 200, false)],
            runs: vec![(5, 2), (8, 3)],
            header_epochs: vec![(SegmentId(2), Epoch(3))],
        }
    }

    fn roundtrip(r: &LogRecord) -> Result<LogRecord, DecodeError> {
        let mut bytes = Vec::new();
        r.encode(&mut Writer { buf: &mut bytes });
        LogRecord::decode(&mut Reader::new(&bytes))
    }

    #[test]
    fn a_record_decodes_to_itself_and_places_each_group() {
        let r = record();
        assert_eq!(roundtrip(&r), Ok(r.clone()));
        assert_eq!((r.last_index(), r.segments()), (9, vec![SegmentId(1), SegmentId(2)]));
        assert_eq!([6, 7, 8, 9].map(|i| r.term(i)), [2, 2, 3, 3]);
        let offsets = [6, 7, 8, 9].map(|i| (r.place(i).segment.0, r.place(i).offset, r.place(i).len));
        assert_eq!(offsets, [(1, 300, 100), (1, 400, 100), (2, SEGMENT_HEADER_BYTES as u64, 100), (2, 132, 68)]);
    }

    #[test]
    fn a_log_made_from_a_record_keeps_it() {
        let hard = HardState { term: 3, vote: 1, commit: 7, ..HardState::default() };
        let log = Log::recorded(hard, ConfState::default(), record());
        assert_eq!(log.record(), record());
        assert_eq!((log.last_index(), log.term_of(8), log.place(8)), (9, Some(3), record().place(8)));
        // The groups past the commit index become entries from their bytes
        // (none given here: raft's log would lack them).
        assert!(std::panic::catch_unwind(|| log.finish_restore(Vec::new())).is_err());
    }

    #[test]
    fn a_record_whose_indexes_or_terms_do_not_follow_does_not_decode() {
        let mut gap = record();
        gap.ends.remove(1);
        let mut falling = record();
        falling.runs = vec![(5, 3), (8, 2)];
        let mut late = record();
        late.runs = vec![(6, 2), (8, 3)];
        let mut past = record();
        past.runs.push((10, 4));
        let mut backwards = record();
        backwards.ends[1].end = 350;
        let mut outside = record();
        outside.ends[3].end = 5000;
        for r in [gap, falling, late, past, backwards, outside] {
            assert_eq!(roundtrip(&r), Err(DecodeError), "{r:?}");
        }
    }
}
