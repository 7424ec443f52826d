//! Newtypes for every id and position the engine handles, so that a segment id
//! can never be passed where an LSN is expected.

use std::fmt;

macro_rules! id {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id!(
    /// Log sequence number: one per commit group, dense from zero.
    Lsn(u64)
);
id!(
    /// A WAL segment's id; segment ids only grow.
    SegmentId(u64)
);
id!(
    /// The writer's epoch; each incarnation of the writer takes a higher one.
    Epoch(u64)
);
id!(
    /// Names one I/O request so its completion can find it.
    IoId(u64)
);
id!(
    /// Index of a source in `HostConfig::sources`.
    SourceId(u16)
);
id!(
    /// Index of a sink in `HostConfig::sinks`.
    SinkId(u16)
);
id!(
    /// Index of a stream in `HostConfig::streams`.
    StreamId(u16)
);
id!(
    /// A place in a source partition. Positions only grow; a partition's
    /// committed position is the next position to read.
    Position(u64)
);
id!(
    /// Dense per (sink, stream) number of a destination batch.
    CompactionSeq(u64)
);

/// Stable id of a destination batch: a pure function of the committed WAL
/// content it covers (see `compaction::compaction_id`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct CompactionId(pub u64);

impl fmt::Debug for CompactionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CompactionId({:016x})", self.0)
    }
}

impl fmt::Display for CompactionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// One source partition: the key of an offsets entry (with the pipeline).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Debug)]
pub struct PartitionKey {
    pub source: SourceId,
    pub partition: u32,
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.source.0, self.partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_as_operators_read_them() {
        assert_eq!(format!("{:?}", CompactionId(0xab)), "CompactionId(00000000000000ab)");
        assert_eq!(CompactionId(0xab).to_string(), "00000000000000ab");
        assert_eq!(PartitionKey { source: SourceId(2), partition: 7 }.to_string(), "2/7");
    }
}
