//! Planted bugs. Each one breaks a rule of the contract on purpose, so the
//! simulator can show that its checker notices. All are off by default; when
//! off, each costs one bit test on the path it guards.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mutation {
    /// Acks a source batch when it enters the pending group, before commit.
    AckBeforeCommit,
    /// Writes offsets for positions that are only pending, not committed.
    OffsetsBeforeCommit,
    /// Dispatches a compaction under an id that changes with the writer epoch.
    UnstableCompactionId,
    /// Deletes sealed segments without waiting for the sinks' acknowledgement.
    DeleteBeforeCompactionAck,
    /// Admits the last, torn commit group without checking its checksums.
    AdmitTornSegment,
    /// Forgets planned-but-unacknowledged compactions at recovery.
    SkipCompactionReplay,
    /// Dispatches a compaction before its planned frame is committed.
    DispatchBeforePlanCommit,
    /// Writes snapshots without the sinks' compacted-through positions.
    SnapshotDropsFrontier,
    /// Keeps re-sent records below the partition's position (already held).
    AcceptResentRecords,
    /// Deletes the oldest sealed segment during recovery, compacted or not
    /// (in clustered mode, without raft's log moving past it).
    DeleteDuringRecovery,
    /// Materializes the first batch a commit held for a partition instead of
    /// the last (a value captured too early).
    OffsetsStaleValue,
    /// Draws retry jitter from a counter shared by every engine in the
    /// process, so the same seed can take another path.
    NondeterministicRetry,
    /// Takes a conditional WAL write that found another writer's bytes in
    /// place as a success, and goes on committing and acknowledging.
    StaleWriterCommits,
    /// The S3 model's writer retries an ambiguous put without
    /// `If-None-Match`, so a late copy overwrites whatever is at the key.
    S3OverwriteOnAmbiguous,
    /// The DynamoDB offsets model drops the `lsn < :lsn` condition, so a
    /// late write replaces a newer value.
    OffsetsRegress,
    /// Recovers from whatever segments are there, without checking that
    /// none is missing in the middle or still needed before the oldest.
    IgnoreMissingSegments,
    /// Matches the batches of a group read back from the WAL to the plan's
    /// ranges by source alone, so another partition's records can stand in.
    ReadBackWrongPartition,
    /// Reads back a run of batches held only in the WAL as if its first
    /// group were all of it: the groups after it are checked, their
    /// records left out.
    ReadBackOneGroupOfARun,
    /// Clustered mode: a host answers its leader's append (and votes)
    /// before the groups and hard state of that `Ready` are durable.
    AckBeforePersist,
    /// Clustered mode: the hard state saved lacks the vote, so a restarted
    /// host may vote twice in one term.
    VoteNotPersisted,
    /// Clustered mode: a conflicting uncommitted tail is overwritten in
    /// place; what is left of it is neither removed nor zeroed.
    NoTruncateOnConflict,
    /// Clustered mode: the leader takes its own group as committed once its
    /// own disk has it, without waiting for a majority.
    CommitBeforeQuorum,
    /// Clustered mode: a new leader serves (sources, sinks, acks) as soon as
    /// it is elected, before a group of its own term has committed.
    ServeBeforeTermCommit,
    /// Clustered mode: a host whose DATA_DIR is empty (wiped, its data
    /// lost) starts as a fresh voter under its old id instead of refusing,
    /// so it may vote for a log that lacks what it had acknowledged.
    WipedPeerVotes,
    /// Clustered `--once`: the leader commits the terminal entry as soon as
    /// its sources are exhausted, before what they delivered went through
    /// the sinks, so the hosts stop with records undelivered.
    FinishBeforeDrained,
    /// Recovery's streaming scan takes a group cut off by the end of its
    /// read window for a torn one (the WAL's end) instead of reading on.
    DropUnfinishedGroup,
    /// A start takes the stop record as it finds it, without checking it
    /// against the WAL (a record a later run made stale is trusted).
    TrustStaleStopRecord,
    /// Dead letters: the refused records go to the dead letters as soon as
    /// the sink refuses them, before the refusal is committed.
    LettersBeforeDecision,
    /// Dead letters: a restarted engine forgets an open plan's committed
    /// refusals, sends the plan whole again and decides anew.
    ReplayDecidesAgain,
    /// Dead letters: a restarted engine sends a settled plan's dead letters
    /// under the next number instead of the one committed.
    LettersRenumbered,
    /// Gives up, with the open plan an operator names, everything the
    /// stream's partitions have committed past it (the planned-through
    /// positions moved to the committed ones): records never planned are
    /// never delivered.
    BatchSkipTooFar,
    /// Dead letters: a plan cut by a split and done leaves the
    /// planned-through positions where the whole plan ended, so the rest
    /// the split cut off is never planned again.
    SplitLosesRest,
    /// Dead letters: a record refused at intake, committed quarantined, is
    /// sent to the sinks like any other.
    QuarantineSent,
    /// Windows: compaction plans a partition's records up to the end of its
    /// source's open window, not its committed position.
    CompactionOverOpenWindow,
    /// Windows: recovery closes a window the WAL holds open (with the
    /// checkpoint its partitions had) instead of voiding it.
    UnclosedWindowKept,
    /// Windows: a source's restart arms no tail, so the records a tap sends
    /// again at its bookmark pass through.
    BookmarkDuplicatePassed,
}

impl Mutation {
    pub const ALL: &'static [Mutation] = &[
        Mutation::AckBeforeCommit,
        Mutation::OffsetsBeforeCommit,
        Mutation::UnstableCompactionId,
        Mutation::DeleteBeforeCompactionAck,
        Mutation::AdmitTornSegment,
        Mutation::SkipCompactionReplay,
        Mutation::DispatchBeforePlanCommit,
        Mutation::SnapshotDropsFrontier,
        Mutation::AcceptResentRecords,
        Mutation::DeleteDuringRecovery,
        Mutation::OffsetsStaleValue,
        Mutation::NondeterministicRetry,
        Mutation::StaleWriterCommits,
        Mutation::S3OverwriteOnAmbiguous,
        Mutation::OffsetsRegress,
        Mutation::IgnoreMissingSegments,
        Mutation::ReadBackWrongPartition,
        Mutation::ReadBackOneGroupOfARun,
        Mutation::DropUnfinishedGroup,
        Mutation::TrustStaleStopRecord,
        Mutation::LettersBeforeDecision,
        Mutation::ReplayDecidesAgain,
        Mutation::LettersRenumbered,
        Mutation::BatchSkipTooFar,
        Mutation::SplitLosesRest,
        Mutation::QuarantineSent,
        Mutation::CompactionOverOpenWindow,
        Mutation::UnclosedWindowKept,
        Mutation::BookmarkDuplicatePassed,
    ];

    /// The planted bugs of clustered mode, which only its runs can reach.
    pub const CLUSTERED: &'static [Mutation] = &[
        Mutation::CommitBeforeQuorum,
        Mutation::AckBeforePersist,
        Mutation::VoteNotPersisted,
        Mutation::NoTruncateOnConflict,
        Mutation::ServeBeforeTermCommit,
        Mutation::WipedPeerVotes,
        Mutation::FinishBeforeDrained,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mutation::AckBeforeCommit => "ack-before-commit",
            Mutation::OffsetsBeforeCommit => "offsets-before-commit",
            Mutation::UnstableCompactionId => "unstable-compaction-id",
            Mutation::DeleteBeforeCompactionAck => "delete-before-compaction-ack",
            Mutation::AdmitTornSegment => "admit-torn-segment",
            Mutation::SkipCompactionReplay => "skip-compaction-replay",
            Mutation::DispatchBeforePlanCommit => "dispatch-before-plan-commit",
            Mutation::SnapshotDropsFrontier => "snapshot-drops-frontier",
            Mutation::AcceptResentRecords => "accept-resent-records",
            Mutation::DeleteDuringRecovery => "delete-during-recovery",
            Mutation::OffsetsStaleValue => "offsets-stale-value",
            Mutation::NondeterministicRetry => "nondeterministic-retry",
            Mutation::StaleWriterCommits => "stale-writer-commits",
            Mutation::S3OverwriteOnAmbiguous => "s3-overwrite-on-ambiguous",
            Mutation::OffsetsRegress => "offsets-regress",
            Mutation::IgnoreMissingSegments => "ignore-missing-segments",
            Mutation::ReadBackWrongPartition => "read-back-wrong-partition",
            Mutation::ReadBackOneGroupOfARun => "read-back-one-group-of-a-run",
            Mutation::AckBeforePersist => "ack-before-persist",
            Mutation::VoteNotPersisted => "vote-not-persisted",
            Mutation::NoTruncateOnConflict => "no-truncate-on-conflict",
            Mutation::CommitBeforeQuorum => "commit-before-quorum",
            Mutation::ServeBeforeTermCommit => "serve-before-term-commit",
            Mutation::WipedPeerVotes => "wiped-peer-votes",
            Mutation::FinishBeforeDrained => "finish-before-drained",
            Mutation::DropUnfinishedGroup => "drop-unfinished-group",
            Mutation::TrustStaleStopRecord => "trust-stale-stop-record",
            Mutation::LettersBeforeDecision => "dead-letters-before-decision",
            Mutation::ReplayDecidesAgain => "replay-decides-again",
            Mutation::LettersRenumbered => "dead-letters-renumbered",
            Mutation::BatchSkipTooFar => "batch-skip-too-far",
            Mutation::SplitLosesRest => "split-loses-rest",
            Mutation::QuarantineSent => "quarantine-sent",
            Mutation::CompactionOverOpenWindow => "compaction-over-open-window",
            Mutation::UnclosedWindowKept => "unclosed-window-kept",
            Mutation::BookmarkDuplicatePassed => "bookmark-duplicate-passed",
        }
    }

    pub fn from_name(name: &str) -> Option<Mutation> {
        Mutation::ALL.iter().chain(Mutation::CLUSTERED).copied().find(|m| m.name() == name)
    }
}

impl fmt::Display for Mutation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The set of planted bugs switched on; empty in production.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mutations(u64);

impl Mutations {
    pub const NONE: Mutations = Mutations(0);

    pub fn with(self, m: Mutation) -> Mutations {
        Mutations(self.0 | 1 << m as u32)
    }

    #[inline]
    pub fn has(self, m: Mutation) -> bool {
        self.0 & (1 << m as u32) != 0
    }

    pub fn iter(self) -> impl Iterator<Item = Mutation> {
        Mutation::ALL.iter().chain(Mutation::CLUSTERED).copied().filter(move |m| self.has(*m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_planted_bug_has_its_own_name_and_bit() {
        let mut names = std::collections::BTreeSet::new();
        let all: Vec<Mutation> = Mutation::ALL.iter().chain(Mutation::CLUSTERED).copied().collect();
        for &m in &all {
            assert!(names.insert(m.name()), "{} named twice", m.name());
            assert_eq!(Mutation::from_name(m.name()), Some(m));
            assert_eq!(m.to_string(), m.name());
            let on = Mutations::NONE.with(m);
            assert!(on.has(m));
            assert!(all.iter().all(|&o| o == m || !on.has(o)), "{m} turns on only itself");
            assert!(on.with(Mutation::AckBeforeCommit).has(m), "adding one keeps the others");
        }
        assert!(names
            .iter()
            .all(|n| n.len() > 3 && n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')));
        assert_eq!(Mutation::from_name("no-such-bug"), None);
    }
}
