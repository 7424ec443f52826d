//! Snapshots as manifests. Every host's segments are byte-identical, so a
//! follower too far behind (it needs entries from segments its leader has
//! deleted) is not sent state: raft's snapshot message carries only a
//! manifest, naming the leader's surviving segments and how many bytes of
//! each hold the log up to the snapshot's index. The follower copies those
//! bytes from the leader (the transfer; over peer connections in the
//! daemon), checks them against the manifest (`check_install`), and swaps
//! them in for its whole WAL at once, together with the hard state that
//! says they are committed. The snapshot frame its first segment opens
//! with is the state it then recovers from, like any host whose older
//! segments are gone.
//!
//! A manifest is `version u8 | index u64 | term u64 | sealed u8 | count
//! u32 | count × (segment u64 | bytes u64 | size u64) | members`
//! (little-endian), `members` being the sender's membership record (its
//! removed ids and pending replacements are the cluster's as of `index`).

use super::hard_state::Members;
use crate::ids::*;
use crate::wal::{scan, Frame};

const VERSION: u8 = 1;

/// One segment to copy: its id, the bytes from its start that hold the
/// log through the snapshot's index, and its size (the file is
/// preallocated to it, zeros after the bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestSegment {
    pub id: SegmentId,
    pub bytes: u64,
    pub size: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The snapshot's raft index and term: its last group's LSN and epoch.
    pub index: u64,
    pub term: u64,
    /// The last group sealed its segment.
    pub sealed: bool,
    /// Oldest first, consecutive.
    pub segments: Vec<ManifestSegment>,
    pub members: Members,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(22 + 24 * self.segments.len());
        out.push(VERSION);
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&self.term.to_le_bytes());
        out.push(self.sealed as u8);
        out.extend_from_slice(&(self.segments.len() as u32).to_le_bytes());
        for s in &self.segments {
            for v in [s.id.0, s.bytes, s.size] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out.extend_from_slice(&self.members.encode());
        out
    }

    pub fn decode(b: &[u8]) -> Option<Manifest> {
        let u = |at: usize| Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?));
        if b.first() != Some(&VERSION) {
            return None;
        }
        let (index, term) = (u(1)?, u(9)?);
        let sealed = match b.get(17)? {
            0 => false,
            1 => true,
            _ => return None,
        };
        let count = u32::from_le_bytes(b.get(18..22)?.try_into().ok()?) as usize;
        let mut at = 22;
        let mut segments = Vec::with_capacity(count.min(b.len() / 24));
        for _ in 0..count {
            segments.push(ManifestSegment { id: SegmentId(u(at)?), bytes: u(at + 8)?, size: u(at + 16)? });
            at += 24;
        }
        let members = Members::decode(b.get(at..)?)?;
        Some(Manifest { index, term, sealed, segments, members })
    }

    /// The files to install, cut from the sender's segments (`segment`
    /// gives one's bytes): each manifest segment's bytes, then zeros to its
    /// size. `None` when the sender lacks a segment or its bytes.
    pub fn copy_from<'a>(&self, segment: impl Fn(SegmentId) -> Option<&'a [u8]>) -> Option<Vec<(SegmentId, Vec<u8>)>> {
        self.segments
            .iter()
            .map(|m| {
                let mut copy = segment(m.id)?.get(..m.bytes as usize)?.to_vec();
                copy.resize(m.size as usize, 0);
                Some((m.id, copy))
            })
            .collect()
    }
}

/// Checks segments copied for `manifest` before they replace a host's WAL:
/// exactly its segments, each of its size, scanning as one WAL that opens
/// (after any lone fences) with a snapshot, or at genesis, and ends with
/// the group at the manifest's index and term, at the byte it names.
pub fn check_install(manifest: &Manifest, segments: &[(SegmentId, &[u8])]) -> Result<(), &'static str> {
    let ids = |m: &[ManifestSegment]| m.iter().map(|s| s.id).collect::<Vec<_>>();
    if ids(&manifest.segments) != segments.iter().map(|s| s.0).collect::<Vec<_>>() {
        return Err("the copied segments are not the manifest's");
    }
    if manifest.segments.iter().zip(segments).any(|(m, s)| s.1.len() as u64 != m.size || m.bytes > m.size) {
        return Err("a copied segment is not the size the manifest gives");
    }
    let scanned = scan(segments, false).map_err(|_| "the copied segments do not scan")?;
    let mut groups = scanned.iter().flat_map(|s| s.groups.iter().map(move |g| (s.id, g)));
    let head = groups.clone().find(|(_, g)| !matches!(g.frames.as_slice(), [Frame::Fence]));
    match head {
        Some((_, g)) if g.lsn == Lsn(0) || matches!(g.frames.first(), Some(Frame::Snapshot(_))) => {}
        _ => return Err("the copied segments do not open with a snapshot"),
    }
    let Some((segment, last)) = groups.next_back() else { return Err("the copied segments hold no group") };
    let expected = manifest.segments.last().expect("checked above: as many as copied, and some were");
    if last.lsn != Lsn(manifest.index) || last.epoch != Epoch(manifest.term) {
        return Err("the copied segments do not end at the snapshot's index and term");
    }
    if segment != expected.id || last.end != expected.bytes {
        return Err("the copied segments do not end where the manifest says");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::{encode_group, encode_header};

    fn members() -> Members {
        Members { cluster: 7, node: 1, segment_bytes: 4096, removed: vec![4], replacing: vec![(6, 2)] }
    }

    #[test]
    fn a_manifest_decodes_to_what_was_encoded_and_refuses_damage() {
        let m = Manifest {
            index: 41,
            term: 3,
            sealed: true,
            segments: vec![
                ManifestSegment { id: SegmentId(5), bytes: 4000, size: 4096 },
                ManifestSegment { id: SegmentId(6), bytes: 4096, size: 4096 },
            ],
            members: members(),
        };
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes), Some(m));
        for cut in 0..bytes.len() {
            assert_eq!(Manifest::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut bad = bytes.clone();
        bad[17] = 2;
        assert_eq!(Manifest::decode(&bad), None);
    }

    /// Segment 3 opening with a lone fence at LSN 10 (term 2), then a
    /// snapshot group at 11 and a fence at 12 (term 3).
    fn segment() -> (Vec<u8>, u64, u64) {
        let id = SegmentId(3);
        let mut bytes = encode_header(id, Epoch(2));
        bytes.extend(encode_group(id, Epoch(2), Lsn(10), &[&Frame::Fence]));
        let state = crate::state::CommittedState::default();
        let snap = Frame::Snapshot(state.snapshot(false, &Default::default()));
        bytes.extend(encode_group(id, Epoch(2), Lsn(11), &[&snap]));
        let after_snapshot = bytes.len() as u64;
        bytes.extend(encode_group(id, Epoch(3), Lsn(12), &[&Frame::Fence]));
        let end = bytes.len() as u64;
        bytes.resize(4096, 0);
        (bytes, after_snapshot, end)
    }

    #[test]
    fn an_install_is_checked_against_its_manifest() {
        let (bytes, after_snapshot, end) = segment();
        let manifest = |index, term, bytes| Manifest {
            index,
            term,
            sealed: false,
            segments: vec![ManifestSegment { id: SegmentId(3), bytes, size: 4096 }],
            members: members(),
        };
        let copied = [(SegmentId(3), bytes.as_slice())];
        assert_eq!(check_install(&manifest(12, 3, end), &copied), Ok(()));
        // The leader's log goes on past the snapshot: the copy must stop at it.
        assert!(check_install(&manifest(11, 2, after_snapshot), &copied).is_err());
        assert!(check_install(&manifest(12, 2, end), &copied).is_err(), "another term");
        assert!(check_install(&manifest(12, 3, end + 1), &copied).is_err(), "another end");
        let cut = &bytes[..after_snapshot as usize];
        let mut short = cut.to_vec();
        short.resize(4096, 0);
        assert_eq!(check_install(&manifest(11, 2, after_snapshot), &[(SegmentId(3), &short)]), Ok(()));
        assert!(check_install(&manifest(12, 3, end), &[(SegmentId(4), bytes.as_slice())]).is_err(), "another id");
        assert!(check_install(&manifest(12, 3, end), &[(SegmentId(3), &bytes[..4000])]).is_err(), "another size");
        let mut damaged = bytes.clone();
        damaged[end as usize - 3] ^= 1;
        assert!(check_install(&manifest(12, 3, end), &[(SegmentId(3), &damaged)]).is_err(), "damaged bytes");
    }
}
