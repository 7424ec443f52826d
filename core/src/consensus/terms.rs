//! Which term each raft index of the log belongs to, without keeping the
//! entries: raft-rs asks its storage for the term of any index it holds
//! (`Storage::term`) synchronously, while the entries themselves live in
//! WAL segments on disk. Terms change rarely, so the log is a short list of
//! runs: the first index of each term, in order.

use std::collections::VecDeque;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TermRuns {
    /// (first index, term), both strictly increasing.
    runs: VecDeque<(u64, u64)>,
    /// One past the last index held; 0 when nothing is.
    end: u64,
    /// The first index held (earlier ones were compacted away).
    first: u64,
}

impl TermRuns {
    /// An empty log whose next index is `next`.
    pub fn starting_at(next: u64) -> TermRuns {
        TermRuns { runs: VecDeque::new(), end: next, first: next }
    }

    /// The first index held, and one past the last.
    #[cfg(test)]
    pub fn bounds(&self) -> (u64, u64) {
        (self.first, self.end)
    }

    /// Appends index `index` of `term`. Indexes must follow one another and
    /// terms never go down (raft's log matching).
    pub fn push(&mut self, index: u64, term: u64) {
        assert_eq!(index, self.end, "indexes follow one another");
        match self.runs.back() {
            Some(&(_, t)) if t == term => {}
            Some(&(_, t)) => {
                assert!(term > t, "terms never go down in a log");
                self.runs.push_back((index, term));
            }
            None => self.runs.push_back((index, term)),
        }
        self.end = index + 1;
    }

    /// The term of `index`, if the log holds it.
    pub fn term(&self, index: u64) -> Option<u64> {
        if index < self.first || index >= self.end {
            return None;
        }
        let at = self.runs.partition_point(|&(first, _)| first <= index);
        Some(self.runs[at - 1].1)
    }

    /// Drops `from` and everything after it (a conflicting tail).
    pub fn truncate(&mut self, from: u64) {
        if from >= self.end {
            return;
        }
        let from = from.max(self.first);
        while self.runs.back().is_some_and(|&(first, _)| first >= from) {
            self.runs.pop_back();
        }
        self.end = from;
    }

    /// Forgets the indexes below `below` (deleted segments).
    pub fn compact(&mut self, below: u64) {
        let below = below.min(self.end);
        if below <= self.first {
            return;
        }
        // The run holding `below` becomes the first; runs wholly before go.
        while self.runs.len() > 1 && self.runs[1].0 <= below {
            self.runs.pop_front();
        }
        if let Some(front) = self.runs.front_mut() {
            front.0 = front.0.max(below);
        }
        if below == self.end {
            self.runs.clear();
        }
        self.first = below;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Terms 1 1 1 2 2 5 at indexes 1..=6.
    fn log() -> TermRuns {
        let mut t = TermRuns::starting_at(1);
        for (i, term) in [1, 1, 1, 2, 2, 5].into_iter().enumerate() {
            t.push(i as u64 + 1, term);
        }
        t
    }

    #[test]
    fn every_index_has_its_term_and_nothing_outside_has_one() {
        let t = log();
        let terms: Vec<_> = (0..=7).map(|i| t.term(i)).collect();
        assert_eq!(terms, [None, Some(1), Some(1), Some(1), Some(2), Some(2), Some(5), None]);
        assert_eq!(t.bounds(), (1, 7));
        assert_eq!(t.runs.len(), 3, "one run per term");
    }

    #[test]
    fn truncating_a_conflicting_tail_and_appending_a_new_term() {
        let mut t = log();
        t.truncate(5);
        assert_eq!((t.term(4), t.term(5), t.bounds()), (Some(2), None, (1, 5)));
        t.push(5, 3);
        assert_eq!((t.term(4), t.term(5)), (Some(2), Some(3)));
        t.truncate(4);
        assert_eq!((t.term(3), t.term(4)), (Some(1), None));
        t.truncate(100);
        assert_eq!(t.bounds(), (1, 4), "truncating past the end changes nothing");
    }

    #[test]
    fn compacting_keeps_the_terms_of_what_remains() {
        let mut t = log();
        t.compact(5);
        assert_eq!((t.term(4), t.term(5), t.term(6)), (None, Some(2), Some(5)));
        assert_eq!(t.bounds(), (5, 7));
        t.compact(3);
        assert_eq!(t.bounds(), (5, 7), "compacting backwards changes nothing");
        t.compact(7);
        assert_eq!((t.term(6), t.bounds()), (None, (7, 7)));
        t.push(7, 6);
        assert_eq!(t.term(7), Some(6));
    }

    #[test]
    #[should_panic(expected = "terms never go down")]
    fn a_term_going_down_is_refused() {
        let mut t = log();
        t.push(7, 4);
    }
}
