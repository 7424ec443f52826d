//! The hard-state file's format: raft's term, vote and commit index and the
//! cluster configuration (`HardState`, `ConfState`), kept in two checksummed
//! slots of one file in `DATA_DIR` (never in the offsets store), written
//! alternately, so that a write torn by a crash leaves the other slot, the
//! previous state, intact. The driver writes a slot only after the entries
//! of the same `Ready` are durable, and syncs it before any message of that
//! `Ready` that depends on it (a vote) leaves.
//!
//! A slot is `magic "SKPRHST\0" | version u32 | crc u32 | seq u64 | len u32
//! | payload[len] | zeros`, the CRC32C covering the version and everything
//! from `seq` to the payload's end; the payload is the hard state and the
//! configuration in raft-rs's own protobuf encoding, then the host's
//! `Members` record (little-endian), each prefixed by its length. The slot
//! with the higher valid `seq` is the current state.
//!
//! `skipprd cluster init` (and `cluster join`) write the first slot: the
//! cluster's id, this host's node id and the cluster's segment size, with
//! the initial configuration (every voter for `init`, none for `join`: a
//! joining host learns its membership from the log). A host whose file is
//! missing has no identity and takes no part.

use protobuf::Message as _;
use raft::eraftpb::{ConfState, HardState};
use std::fmt;

/// Bytes of one slot, and of the file (two slots).
pub const SLOT_BYTES: usize = 4096;
pub const FILE_BYTES: usize = 2 * SLOT_BYTES;
const MAGIC: &[u8; 8] = b"SKPRHST\0";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 4;

/// A saved state: its sequence number (which slot it went to) and the state.
#[derive(Clone, Debug, PartialEq)]
pub struct Saved {
    pub seq: u64,
    pub hard: HardState,
    pub conf: ConfState,
    pub members: Members,
}

/// Who this host is, in which cluster, and what the membership changes it
/// applied leave behind beyond raft-rs's `ConfState`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    /// The cluster's id, the same on every host (`cluster init` draws it).
    pub cluster: u64,
    /// This host's raft node id.
    pub node: u64,
    /// The cluster's segment size: a host's first segment gets it.
    pub segment_bytes: u64,
    /// Ids removed from the cluster, ascending: refused forever.
    pub removed: Vec<u64>,
    /// (learner, the voter it replaces) for each learner that joined in
    /// place of a lost host and is not yet promoted, ascending.
    pub replacing: Vec<(u64, u64)>,
}

impl Members {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(36 + 8 * self.removed.len() + 16 * self.replacing.len());
        for v in [self.cluster, self.node, self.segment_bytes] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.removed.len() as u32).to_le_bytes());
        for id in &self.removed {
            out.extend_from_slice(&id.to_le_bytes());
        }
        out.extend_from_slice(&(self.replacing.len() as u32).to_le_bytes());
        for (learner, old) in &self.replacing {
            out.extend_from_slice(&learner.to_le_bytes());
            out.extend_from_slice(&old.to_le_bytes());
        }
        out
    }

    pub(crate) fn decode(mut b: &[u8]) -> Option<Members> {
        let mut u64_ = || -> Option<u64> {
            let v = u64::from_le_bytes(b.get(0..8)?.try_into().ok()?);
            b = &b[8..];
            Some(v)
        };
        let (cluster, node, segment_bytes) = (u64_()?, u64_()?, u64_()?);
        let mut m = Members { cluster, node, segment_bytes, ..Members::default() };
        let count = |b: &mut &[u8]| -> Option<usize> {
            let n = u32::from_le_bytes(b.get(0..4)?.try_into().ok()?) as usize;
            *b = &b[4..];
            Some(n)
        };
        let take = |b: &mut &[u8]| -> Option<u64> {
            let v = u64::from_le_bytes(b.get(0..8)?.try_into().ok()?);
            *b = &b[8..];
            Some(v)
        };
        for _ in 0..count(&mut b)? {
            m.removed.push(take(&mut b)?);
        }
        for _ in 0..count(&mut b)? {
            m.replacing.push((take(&mut b)?, take(&mut b)?));
        }
        b.is_empty().then_some(m)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HardStateError {
    /// The state does not fit a slot (a configuration of very many hosts).
    TooLarge { bytes: usize },
    /// Neither slot holds a valid state, yet the file is not a fresh one.
    Corrupt { what: &'static str },
}

impl fmt::Display for HardStateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HardStateError::TooLarge { bytes } => {
                write!(f, "the raft hard state takes {bytes} bytes, more than a slot's {}", SLOT_BYTES - HEADER_BYTES)
            }
            HardStateError::Corrupt { what } => write!(f, "the raft hard-state file is damaged: {what}"),
        }
    }
}

impl std::error::Error for HardStateError {}

/// Where the slot of `seq` starts in the file.
pub fn slot_offset(seq: u64) -> u64 {
    (seq % 2) * SLOT_BYTES as u64
}

/// The bytes that begin the slot of state `seq`: its header and payload,
/// written at the slot's start. What follows them in the slot is left as it
/// is (the checksum covers only these), so a save is one small write.
pub fn encode_slot(seq: u64, hard: &HardState, conf: &ConfState, members: &Members) -> Result<Vec<u8>, HardStateError> {
    let mut slot = Vec::with_capacity(256);
    slot.extend_from_slice(MAGIC);
    slot.extend_from_slice(&VERSION.to_le_bytes());
    // The checksum and the payload's length are filled in below.
    slot.extend_from_slice(&[0; 4]);
    slot.extend_from_slice(&seq.to_le_bytes());
    slot.extend_from_slice(&[0; 4]);
    // Each part is its length and its bytes, written in place.
    let part = |slot: &mut Vec<u8>, write: &dyn Fn(&mut Vec<u8>)| {
        let at = slot.len();
        slot.extend_from_slice(&[0; 4]);
        write(slot);
        let len = (slot.len() - at - 4) as u32;
        slot[at..at + 4].copy_from_slice(&len.to_le_bytes());
    };
    part(&mut slot, &|v| hard.write_to_vec(v).expect("raft-rs's states always encode"));
    part(&mut slot, &|v| conf.write_to_vec(v).expect("raft-rs's states always encode"));
    part(&mut slot, &|v| v.extend_from_slice(&members.encode()));
    let len = slot.len() - HEADER_BYTES;
    if slot.len() > SLOT_BYTES {
        return Err(HardStateError::TooLarge { bytes: len });
    }
    slot[24..28].copy_from_slice(&(len as u32).to_le_bytes());
    let crc = slot_crc(&slot, len);
    slot[12..16].copy_from_slice(&crc.to_le_bytes());
    Ok(slot)
}

/// The whole file `cluster init` writes (`voters`: every voter of the new
/// cluster), or `cluster join` (`voters` empty): term 0, no vote, nothing
/// committed, in slot 1.
pub fn first_file(members: &Members, voters: &[u64]) -> Result<Vec<u8>, HardStateError> {
    let mut file = vec![0u8; FILE_BYTES];
    let conf = ConfState::from((voters.to_vec(), vec![]));
    let slot = encode_slot(1, &HardState::default(), &conf, members)?;
    let at = slot_offset(1) as usize;
    file[at..at + slot.len()].copy_from_slice(&slot);
    Ok(file)
}

fn slot_crc(slot: &[u8], len: usize) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&slot[8..12]), &slot[16..HEADER_BYTES + len])
}

/// The sequence number of a slot whose header and checksum are valid.
fn slot_seq(slot: &[u8]) -> Option<u64> {
    if slot.len() != SLOT_BYTES || &slot[0..8] != MAGIC || slot[8..12] != VERSION.to_le_bytes() {
        return None;
    }
    let len = u32::from_le_bytes(slot[24..28].try_into().unwrap()) as usize;
    if HEADER_BYTES + len > SLOT_BYTES || slot_crc(slot, len) != u32::from_le_bytes(slot[12..16].try_into().unwrap()) {
        return None;
    }
    Some(u64::from_le_bytes(slot[16..24].try_into().unwrap()))
}

/// The state a slot `slot_seq` found valid holds, if its parts decode.
fn parse_slot(seq: u64, slot: &[u8]) -> Option<Saved> {
    let len = u32::from_le_bytes(slot[24..28].try_into().unwrap()) as usize;
    let mut payload = &slot[HEADER_BYTES..HEADER_BYTES + len];
    let mut part = || -> Option<&[u8]> {
        let n = u32::from_le_bytes(payload.get(0..4)?.try_into().unwrap()) as usize;
        let bytes = payload.get(4..4 + n)?;
        payload = &payload[4 + n..];
        Some(bytes)
    };
    let hard = HardState::parse_from_bytes(part()?).ok()?;
    let conf = ConfState::parse_from_bytes(part()?).ok()?;
    let members = Members::decode(part()?)?;
    Some(Saved { seq, hard, conf, members })
}

/// The current state in the file's bytes: `None` for a fresh file (empty or
/// all zeros); otherwise the valid slot with the higher sequence number
/// (the first on a tie). Only the slot chosen is parsed, and the other
/// only if that one's parts do not decode.
pub fn decode_file(file: &[u8]) -> Result<Option<Saved>, HardStateError> {
    if file.len() == FILE_BYTES {
        let (a, b) = file.split_at(SLOT_BYTES);
        let mut valid: Vec<(u64, &[u8])> = [a, b].into_iter().filter_map(|s| slot_seq(s).map(|q| (q, s))).collect();
        valid.sort_by_key(|&(seq, _)| std::cmp::Reverse(seq));
        if let Some(saved) = valid.into_iter().find_map(|(seq, slot)| parse_slot(seq, slot)) {
            return Ok(Some(saved));
        }
    }
    match file.len() == FILE_BYTES {
        _ if file.iter().all(|&b| b == 0) => Ok(None),
        false => Err(HardStateError::Corrupt { what: "it is not two slots long" }),
        true => Err(HardStateError::Corrupt { what: "neither slot holds a valid state" }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(term: u64, vote: u64, commit: u64) -> (HardState, ConfState) {
        (HardState { term, vote, commit, ..Default::default() }, ConfState::from((vec![1, 2, 3], vec![4])))
    }

    fn members() -> Members {
        Members { cluster: 77, node: 2, segment_bytes: 1 << 20, removed: vec![5, 9], replacing: vec![(10, 4 << 56)] }
    }

    fn file_with(saves: &[(u64, (HardState, ConfState))]) -> Vec<u8> {
        let mut file = vec![0u8; FILE_BYTES];
        for (seq, (hard, conf)) in saves {
            let at = slot_offset(*seq) as usize;
            let slot = encode_slot(*seq, hard, conf, &members()).unwrap();
            file[at..at + slot.len()].copy_from_slice(&slot);
        }
        file
    }

    #[test]
    fn the_newest_valid_slot_is_the_state_and_a_fresh_file_has_none() {
        assert_eq!(decode_file(&[]), Ok(None));
        assert_eq!(decode_file(&vec![0; FILE_BYTES]), Ok(None));
        let file = file_with(&[(6, state(3, 1, 40)), (7, state(4, 2, 41))]);
        let saved = decode_file(&file).unwrap().unwrap();
        assert_eq!((saved.seq, saved.hard.term, saved.hard.vote, saved.hard.commit), (7, 4, 2, 41));
        assert_eq!((saved.conf.voters.clone(), saved.conf.learners.clone()), (vec![1, 2, 3], vec![4]));
        assert_eq!(saved.members, members());
        assert_eq!(slot_offset(6), 0);
        assert_eq!(slot_offset(7), SLOT_BYTES as u64);
    }

    #[test]
    fn a_torn_write_of_one_slot_leaves_the_previous_state() {
        let mut file = file_with(&[(6, state(3, 1, 40)), (7, state(4, 2, 41))]);
        // Cuts of the newer slot's write (a write that reached the disk only
        // up to some byte), and a flipped bit in it.
        let len = u32::from_le_bytes(file[SLOT_BYTES + 24..SLOT_BYTES + 28].try_into().unwrap()) as usize;
        for cut in [1, 12, 20, HEADER_BYTES + 3, HEADER_BYTES + len - 1] {
            let mut torn = file.clone();
            torn[SLOT_BYTES + cut..].fill(0);
            assert_eq!(decode_file(&torn).unwrap().unwrap().seq, 6, "cut at {cut}");
        }
        file[SLOT_BYTES + HEADER_BYTES + 2] ^= 0x10;
        assert_eq!(decode_file(&file).unwrap().unwrap().hard.term, 3);
    }

    #[test]
    fn a_shorter_state_saved_over_a_longer_one_in_its_slot_is_read_alone() {
        let max = HardState { term: u64::MAX, vote: u64::MAX, commit: u64::MAX, ..Default::default() };
        let long = (max, ConfState::from((vec![1, 2, 3, 4, 5], vec![6, 7])));
        let file = file_with(&[(6, long), (8, state(1, 1, 1))]);
        let saved = decode_file(&file).unwrap().unwrap();
        assert_eq!((saved.seq, saved.hard.term), (8, 1), "the bytes left after it are not part of it");
        let one = encode_slot(8, &state(1, 1, 1).0, &state(1, 1, 1).1, &Members::default()).unwrap();
        assert!(one.len() < 96, "a save is one small write");
    }

    #[test]
    fn a_file_with_no_valid_slot_is_damaged_not_fresh() {
        let mut file = file_with(&[(1, state(1, 1, 1))]);
        file[SLOT_BYTES + 5] = 1; // the other slot is not zeros either
        file[20] ^= 1;
        assert!(matches!(decode_file(&file), Err(HardStateError::Corrupt { .. })));
        assert!(matches!(decode_file(&[1, 2, 3]), Err(HardStateError::Corrupt { .. })));
        let e = decode_file(&file).unwrap_err().to_string();
        assert!(e.contains("hard-state file is damaged"), "{e}");
    }

    #[test]
    fn a_configuration_too_large_for_a_slot_is_refused() {
        let (hard, _) = state(1, 1, 1);
        let conf = ConfState::from(((1..3000u64).map(|i| i << 40).collect::<Vec<_>>(), vec![]));
        assert!(matches!(encode_slot(1, &hard, &conf, &members()), Err(HardStateError::TooLarge { .. })));
    }
}
