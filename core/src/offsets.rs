//! The offsets value: exactly 24 bytes, three little-endian u64s. The embedded
//! store and DynamoDB hold the same bytes. A write replaces the value only when
//! its `lsn` is higher, so a late write never moves a partition backwards.

use crate::ids::{Lsn, Position};

pub const OFFSET_VALUE_BYTES: usize = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct OffsetValue {
    /// The next position to read.
    pub position: Position,
    /// The WAL commit that covers `position`.
    pub lsn: Lsn,
    /// Records committed for this partition so far.
    pub records: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadOffsetValue {
    pub len: usize,
}

impl OffsetValue {
    pub fn encode(&self) -> [u8; OFFSET_VALUE_BYTES] {
        let mut b = [0u8; OFFSET_VALUE_BYTES];
        b[0..8].copy_from_slice(&self.position.0.to_le_bytes());
        b[8..16].copy_from_slice(&self.lsn.0.to_le_bytes());
        b[16..24].copy_from_slice(&self.records.to_le_bytes());
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<OffsetValue, BadOffsetValue> {
        if bytes.len() != OFFSET_VALUE_BYTES {
            return Err(BadOffsetValue { len: bytes.len() });
        }
        let u = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        Ok(OffsetValue { position: Position(u(0)), lsn: Lsn(u(8)), records: u(16) })
    }

    /// The store's rule: `new` replaces `old` only when its LSN is higher.
    pub fn replaces(new: &OffsetValue, old: Option<&OffsetValue>) -> bool {
        old.is_none_or(|old| new.lsn > old.lsn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_is_exactly_24_bytes() {
        let v = OffsetValue { position: Position(1 << 40), lsn: Lsn(7), records: 99 };
        let b = v.encode();
        assert_eq!(b.len(), 24);
        assert_eq!(&b[0..8], &(1u64 << 40).to_le_bytes());
        assert_eq!(OffsetValue::decode(&b), Ok(v));
        assert_eq!(OffsetValue::decode(&b[..23]), Err(BadOffsetValue { len: 23 }));
    }

    #[test]
    fn only_a_higher_lsn_replaces() {
        let old = OffsetValue { position: Position(10), lsn: Lsn(5), records: 10 };
        let late = OffsetValue { position: Position(8), lsn: Lsn(4), records: 8 };
        let same = OffsetValue { lsn: Lsn(5), ..old };
        let newer = OffsetValue { position: Position(12), lsn: Lsn(6), records: 12 };
        assert!(!OffsetValue::replaces(&late, Some(&old)));
        assert!(!OffsetValue::replaces(&same, Some(&old)));
        assert!(OffsetValue::replaces(&newer, Some(&old)));
        assert!(OffsetValue::replaces(&late, None));
    }
}
