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

    /// The indexes follow one another and the runs cover them, terms
    /// rising: what `Log::recorded` relies on.
    fn consistent(&self) -> bool {
        let ends_follow = std::iter::once(&self.base_end)
            .chain(&self.ends)
            .enumerate()
            .all(|(i, e)| e.lsn.0 == self.base.0 + i as u64);
        let runs_rise = self.runs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1);
        let runs_cover = self.runs.first() == Some(&(self.base.0, self.base.1))
            && self.runs.last().is_some_and(|r| r.0 <= self.last_index());
        ends_follow && runs_rise && runs_cover
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
        hard.commit = hard.commit.max(record.base.0);
        let mut log = Log::new(hard, conf, record.base, record.base_end);
        for end in record.ends.iter() {
            log.terms.push(end.lsn.0, record.term(end.lsn.0));
            log.ends.push_back(*end);
        }
        log.header_epochs = record.header_epochs.into_iter().collect();
        log
    }
}
