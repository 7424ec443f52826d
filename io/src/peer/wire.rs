//! The peer protocol's frames, over one TLS stream: `len u32 | kind u8 |
//! body`, little-endian, `len` counting the kind and the body. The dialing
//! host sends `Hello` first and waits for `Welcome` (or `Refused`, with the
//! reason, after which the connection closes); then it sends raft messages,
//! chunk requests and transfer ends, and the accepting host answers chunk
//! requests on the same connection. Raft messages from the accepting host
//! travel on the connection it dials itself. A frame that is too long, of
//! an unknown kind or with a body that does not decode closes the
//! connection: the peer is broken or not a skipprd.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The protocol's version, in every `Hello`; a host refuses another.
pub const VERSION: u32 = 1;
const MAGIC: &[u8; 4] = b"SKPR";
/// The longest frame: a raft message carries at most a few groups (each at
/// most `GROUP_BYTES_LIMIT`), a chunk at most `CHUNK_BYTES`.
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// The bytes of a snapshot's segment one chunk request asks for.
pub const CHUNK_BYTES: u32 = 1 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Who dials: its node id, the cluster's id and the fingerprint of the
    /// settings every host must share (`PeerConfig::fingerprint`).
    Hello {
        version: u32,
        cluster: u64,
        node: u64,
        fingerprint: u64,
    },
    Welcome,
    Refused {
        reason: String,
    },
    /// A raft message, in raft-rs's protobuf encoding.
    Raft(Bytes),
    /// Asks for `len` bytes of the accepting host's `segment` at `offset`
    /// (a snapshot's transfer); answered by `Chunk` or `ChunkFailed` with
    /// the same `request`.
    Fetch {
        request: u64,
        segment: u64,
        offset: u64,
        len: u32,
    },
    Chunk {
        request: u64,
        bytes: Bytes,
    },
    ChunkFailed {
        request: u64,
        reason: String,
    },
    /// The transfer of the accepting host's snapshot to the dialing host
    /// ended: installed (`ok`) or given up.
    TransferEnded {
        ok: bool,
    },
    /// Asks the accepting host, if it leads, to let `node` (the dialing
    /// host, started by `cluster join`) in place of the lost voter
    /// `replaces`.
    Join {
        node: u64,
        replaces: u64,
    },
    /// The dialing host's keepalive, answered by `Pong`: a connection on
    /// which nothing arrives for a while is dead (bytes lost, a peer
    /// stopped), whatever TCP says.
    Ping,
    Pong,
    /// The accepting host's answer to a raft message from a removed id:
    /// `node` (the dialing host) was removed from the cluster for good.
    /// Sent on the connection the removed host dialed, since the others no
    /// longer dial it.
    Removed {
        node: u64,
    },
}

impl Frame {
    fn kind(&self) -> u8 {
        match self {
            Frame::Hello { .. } => 1,
            Frame::Welcome => 2,
            Frame::Refused { .. } => 3,
            Frame::Raft(_) => 4,
            Frame::Fetch { .. } => 5,
            Frame::Chunk { .. } => 6,
            Frame::ChunkFailed { .. } => 7,
            Frame::TransferEnded { .. } => 8,
            Frame::Join { .. } => 9,
            Frame::Ping => 10,
            Frame::Pong => 11,
            Frame::Removed { .. } => 12,
        }
    }

    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(64);
        b.put_u32_le(0);
        b.put_u8(self.kind());
        match self {
            Frame::Hello { version, cluster, node, fingerprint } => {
                b.put_slice(MAGIC);
                b.put_u32_le(*version);
                b.put_u64_le(*cluster);
                b.put_u64_le(*node);
                b.put_u64_le(*fingerprint);
            }
            Frame::Welcome | Frame::Ping | Frame::Pong => {}
            Frame::Refused { reason } => b.put_slice(reason.as_bytes()),
            Frame::Raft(m) => b.put_slice(m),
            Frame::Fetch { request, segment, offset, len } => {
                b.put_u64_le(*request);
                b.put_u64_le(*segment);
                b.put_u64_le(*offset);
                b.put_u32_le(*len);
            }
            Frame::Chunk { request, bytes } => {
                b.put_u64_le(*request);
                b.put_slice(bytes);
            }
            Frame::ChunkFailed { request, reason } => {
                b.put_u64_le(*request);
                b.put_slice(reason.as_bytes());
            }
            Frame::TransferEnded { ok } => b.put_u8(*ok as u8),
            Frame::Join { node, replaces } => {
                b.put_u64_le(*node);
                b.put_u64_le(*replaces);
            }
            Frame::Removed { node } => b.put_u64_le(*node),
        }
        let len = (b.len() - 4) as u32;
        b[..4].copy_from_slice(&len.to_le_bytes());
        b.freeze()
    }

    /// One frame's kind and body (the length already taken off).
    pub fn decode(mut body: Bytes) -> Result<Frame, &'static str> {
        if body.is_empty() {
            return Err("an empty frame");
        }
        let kind = body.get_u8();
        let need = |b: &Bytes, n: usize| if b.len() < n { Err("a frame shorter than its kind needs") } else { Ok(()) };
        let text = |b: Bytes| String::from_utf8(b.to_vec()).map_err(|_| "a reason that is not UTF-8");
        let frame = match kind {
            1 => {
                need(&body, 32)?;
                if &body[..4] != MAGIC {
                    return Err("a hello without skipprd's magic");
                }
                body.advance(4);
                let version = body.get_u32_le();
                let (cluster, node, fingerprint) = (body.get_u64_le(), body.get_u64_le(), body.get_u64_le());
                Frame::Hello { version, cluster, node, fingerprint }
            }
            2 => Frame::Welcome,
            3 => Frame::Refused { reason: text(body.split_off(0))? },
            4 => return Ok(Frame::Raft(body)),
            5 => {
                need(&body, 28)?;
                let (request, segment, offset) = (body.get_u64_le(), body.get_u64_le(), body.get_u64_le());
                Frame::Fetch { request, segment, offset, len: body.get_u32_le() }
            }
            6 => {
                need(&body, 8)?;
                let request = body.get_u64_le();
                return Ok(Frame::Chunk { request, bytes: body });
            }
            7 => {
                need(&body, 8)?;
                let request = body.get_u64_le();
                Frame::ChunkFailed { request, reason: text(body.split_off(0))? }
            }
            8 => {
                need(&body, 1)?;
                match body.get_u8() {
                    0 => Frame::TransferEnded { ok: false },
                    1 => Frame::TransferEnded { ok: true },
                    _ => return Err("a transfer's end that is neither ok nor failed"),
                }
            }
            9 => {
                need(&body, 16)?;
                Frame::Join { node: body.get_u64_le(), replaces: body.get_u64_le() }
            }
            10 => Frame::Ping,
            11 => Frame::Pong,
            12 => {
                need(&body, 8)?;
                Frame::Removed { node: body.get_u64_le() }
            }
            _ => return Err("a frame of an unknown kind"),
        };
        if !body.is_empty() {
            return Err("a frame longer than its kind");
        }
        Ok(frame)
    }
}

/// Reads one frame. `Ok(None)` at a clean end of the stream.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<Frame>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes (at most {FRAME_BYTES_MAX})"),
        ));
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).await?;
    Frame::decode(Bytes::from(body)).map(Some).map_err(|what| io::Error::new(io::ErrorKind::InvalidData, what))
}

pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &Frame) -> io::Result<()> {
    w.write_all(&frame.encode()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Frame> {
        vec![
            Frame::Hello { version: VERSION, cluster: 0xabcd, node: 3, fingerprint: 99 },
            Frame::Welcome,
            Frame::Refused { reason: "another cluster".into() },
            Frame::Raft(Bytes::from_static(b"\x08\x03")),
            Frame::Fetch { request: 7, segment: 12, offset: 4096, len: CHUNK_BYTES },
            Frame::Chunk { request: 7, bytes: Bytes::from_static(b"segment bytes") },
            Frame::ChunkFailed { request: 8, reason: "gone".into() },
            Frame::TransferEnded { ok: true },
            Frame::TransferEnded { ok: false },
            Frame::Join { node: 4, replaces: 2 },
            Frame::Ping,
            Frame::Pong,
            Frame::Removed { node: 3 },
        ]
    }

    /// Kinds whose body ends in free-form bytes: only these may be cut or
    /// lengthened and still decode.
    fn free_form(f: &Frame) -> bool {
        matches!(f, Frame::Raft(_) | Frame::Chunk { .. } | Frame::Refused { .. } | Frame::ChunkFailed { .. })
    }

    #[tokio::test]
    async fn frames_decode_to_what_was_encoded_and_damage_is_refused() {
        let mut stream = Vec::new();
        for f in all() {
            write_frame(&mut stream, &f).await.unwrap();
        }
        let mut r = stream.as_slice();
        for f in all() {
            assert_eq!(read_frame(&mut r).await.unwrap(), Some(f));
        }
        assert_eq!(read_frame(&mut r).await.unwrap(), None, "a clean end");
        for f in all() {
            let body = f.encode().slice(4..);
            for cut in 1..body.len() {
                if let Ok(g) = Frame::decode(body.slice(..cut)) {
                    assert!(free_form(&g), "{g:?}");
                }
            }
            let mut longer = body.to_vec();
            longer.push(0);
            if !free_form(&f) {
                assert!(Frame::decode(Bytes::from(longer)).is_err(), "{f:?} with a byte more");
            }
        }
        assert!(Frame::decode(Bytes::from_static(&[42])).is_err(), "an unknown kind");
        assert!(Frame::decode(Bytes::from_static(b"\x01XXXX0000000000000000000000000000")).is_err(), "no magic");
        let mut huge = (FRAME_BYTES_MAX as u32 + 1).to_le_bytes().to_vec();
        huge.push(4);
        assert!(read_frame(&mut huge.as_slice()).await.is_err(), "too long");
        let mut torn = Frame::Welcome.encode().to_vec();
        torn[0] = 9;
        assert!(read_frame(&mut torn.as_slice()).await.is_err(), "a frame cut short");
    }
}
