//! The peer transport's real code (`skippr_io::peer`) over turmoil's
//! simulated network: partitions and heals, a peer restarted mid-stream,
//! bytes lost on open connections, peers that send garbage or claim to be
//! someone else, and a snapshot transfer interrupted and resumed.

use bytes::Bytes;
use protobuf::Message as _;
use skippr_core::cluster::Members;
use skippr_core::cluster::{Manifest, ManifestSegment};
use skippr_core::SegmentId;
use skippr_core::{PeerMessage, PeerMessageType};
use skippr_io::peer::tls::{generate, server_name, Tls};
use skippr_io::peer::wire::{read_frame, write_frame, Frame, VERSION};
use skippr_io::peer::{transfer, Incoming, Net, PeerConfig, Peers, SegmentReader};
use skippr_io::DiskWal;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const CLUSTER: u64 = 0x5eed;
const FINGERPRINT: u64 = 77;
const PORT: u16 = 7000;

#[derive(Clone, Copy)]
struct Sim;

impl Net for Sim {
    type Stream = turmoil::net::TcpStream;
    type Listener = turmoil::net::TcpListener;

    async fn bind(&self, addr: &str) -> std::io::Result<Self::Listener> {
        let port = addr.rsplit(':').next().unwrap().parse::<u16>().unwrap();
        turmoil::net::TcpListener::bind(("0.0.0.0", port)).await
    }

    async fn accept(listener: &mut Self::Listener) -> std::io::Result<(Self::Stream, String)> {
        let (s, from) = listener.accept().await?;
        Ok((s, from.to_string()))
    }

    async fn connect(&self, addr: &str) -> std::io::Result<Self::Stream> {
        turmoil::net::TcpStream::connect(addr).await
    }
}

/// The CA's and nodes' PEM files, made once.
fn certs() -> &'static skippr_io::peer::tls::Generated {
    static CERTS: OnceLock<skippr_io::peer::tls::Generated> = OnceLock::new();
    CERTS.get_or_init(|| generate(&[1, 2, 3]).unwrap())
}

fn tls(node: u64) -> Tls {
    let (ca, _, nodes) = certs();
    let (_, cert, key) = &nodes[node as usize - 1];
    Tls::from_pem(ca.as_bytes(), cert.as_bytes(), key.as_bytes(), node).unwrap()
}

fn config(node: u64) -> PeerConfig {
    let peers = (1..=3).map(|n| (n, format!("n{n}:{PORT}"))).collect();
    PeerConfig::new(node, CLUSTER, peers, FINGERPRINT)
}

/// Raft messages each host received, by (to, from): how many, and the
/// highest sequence number (carried in `commit`).
#[derive(Default)]
struct Heard {
    count: BTreeMap<(u64, u64), u64>,
    wrong: u64,
}

impl Heard {
    fn count(&self, to: u64, from: u64) -> u64 {
        self.count.get(&(to, from)).copied().unwrap_or(0)
    }
}

struct NoSegments;

impl SegmentReader for NoSegments {
    fn read(&self, _: u64, _: u64, _: usize) -> std::io::Result<Vec<u8>> {
        Err(std::io::Error::other("no segments here"))
    }
}

fn heartbeat(from: u64, to: u64, seq: u64) -> PeerMessage {
    let mut m = PeerMessage::default();
    m.set_msg_type(PeerMessageType::MsgHeartbeat);
    (m.from, m.to, m.commit) = (from, to, seq);
    m
}

/// A host that sends every other host a heartbeat every 20 ms and counts
/// what it hears.
fn chatty(sim: &mut turmoil::Sim, node: u64, heard: &Arc<Mutex<Heard>>) {
    let heard = Arc::clone(heard);
    sim.host(format!("n{node}"), move || {
        let heard = Arc::clone(&heard);
        async move {
            let (peers, mut rx) = Peers::start(Sim, config(node), tls(node), Arc::new(NoSegments)).await?;
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            let mut seq = 0;
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        seq += 1;
                        for to in (1..=3).filter(|n| *n != node) {
                            peers.send(&heartbeat(node, to, seq));
                        }
                    }
                    Some(incoming) = rx.recv() => {
                        let mut h = heard.lock().unwrap();
                        match incoming {
                            Incoming::Raft(m) if m.to == node && m.get_msg_type() == PeerMessageType::MsgHeartbeat => {
                                *h.count.entry((node, m.from)).or_default() += 1
                            }
                            _ => h.wrong += 1,
                        }
                    }
                }
            }
        }
    });
}

fn build(seconds: u64) -> turmoil::Sim<'static> {
    turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(seconds))
        .max_message_latency(Duration::from_millis(5))
        .build()
}

/// Three chatty hosts on a network simulated for `seconds`.
fn three_chatty(seconds: u64) -> (turmoil::Sim<'static>, Arc<Mutex<Heard>>) {
    let mut sim = build(seconds);
    let heard = Arc::new(Mutex::new(Heard::default()));
    for n in 1..=3 {
        chatty(&mut sim, n, &heard);
    }
    (sim, heard)
}

/// How many messages `to` hears from `from` during `span`.
async fn heard_during(heard: &Arc<Mutex<Heard>>, to: u64, from: u64, span: Duration) -> u64 {
    let before = heard.lock().unwrap().count(to, from);
    tokio::time::sleep(span).await;
    heard.lock().unwrap().count(to, from) - before
}

#[test]
fn a_partition_stops_messages_and_its_heal_lets_them_through_again() {
    let (mut sim, heard) = three_chatty(30);
    let h = Arc::clone(&heard);
    sim.client("test", async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (to, from) in [(1, 2), (2, 1), (1, 3), (3, 2)] {
            assert!(h.lock().unwrap().count(to, from) > 10, "{from} → {to} before the partition");
        }
        turmoil::partition("n1", "n2");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(heard_during(&h, 1, 2, Duration::from_secs(2)).await, 0, "nothing crosses a partition");
        assert_eq!(heard_during(&h, 2, 1, Duration::from_secs(1)).await, 0);
        assert!(heard_during(&h, 1, 3, Duration::from_secs(1)).await > 20, "the other links carry on");
        turmoil::repair("n1", "n2");
        // The old connections lost bytes: they break, and are dialled again.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(heard_during(&h, 1, 2, Duration::from_secs(1)).await > 20, "healed 2 → 1");
        assert!(heard_during(&h, 2, 1, Duration::from_secs(1)).await > 20, "healed 1 → 2");
        assert_eq!(h.lock().unwrap().wrong, 0);
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn a_peer_restarted_mid_stream_is_dialled_again() {
    let (mut sim, heard) = three_chatty(30);
    sim.step().unwrap();
    for _ in 0..1000 {
        sim.step().unwrap();
    }
    let before = heard.lock().unwrap().count(1, 2);
    assert!(before > 10, "2 → 1 before the restart: {before}");
    sim.bounce("n2");
    for _ in 0..3000 {
        sim.step().unwrap();
    }
    let h = heard.lock().unwrap();
    assert!(h.count(1, 2) > before + 50, "2 → 1 after the restart: {} then {}", before, h.count(1, 2));
    let (to2, to3) = (h.count(2, 1), h.count(2, 3));
    drop(h);
    for _ in 0..1000 {
        sim.step().unwrap();
    }
    let h = heard.lock().unwrap();
    assert!(h.count(2, 1) > to2 + 20 && h.count(2, 3) > to3 + 20, "the restarted host hears the others");
    assert_eq!(h.wrong, 0);
}

#[test]
fn bytes_lost_on_open_connections_break_them_and_never_reach_the_engine_garbled() {
    let (mut sim, heard) = three_chatty(120);
    let h = Arc::clone(&heard);
    sim.client("test", async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Blips too short for any timeout: segments vanish from streams
        // that stay open on both sides.
        for _ in 0..10 {
            turmoil::partition("n1", "n2");
            tokio::time::sleep(Duration::from_millis(30)).await;
            turmoil::repair("n1", "n2");
            // A stream with a hole delivers nothing more: it is closed once
            // nothing arrived for `dead_after`, and dialled again.
            tokio::time::sleep(config(1).dead_after + Duration::from_secs(1)).await;
            assert!(heard_during(&h, 1, 2, Duration::from_millis(500)).await > 5, "2 → 1 again");
            assert!(heard_during(&h, 2, 1, Duration::from_millis(500)).await > 5, "1 → 2 again");
        }
        assert_eq!(h.lock().unwrap().wrong, 0, "every message delivered was whole and addressed right");
        Ok(())
    });
    sim.run().unwrap();
}

/// Dials node 1 as `node` with `node`'s certificate (or another's) and
/// sends a hello; returns the stream and what node 1 answered.
async fn dial_as(
    cert_of: u64,
    hello: Frame,
) -> (tokio_rustls::client::TlsStream<turmoil::net::TcpStream>, Option<Frame>) {
    let tcp = turmoil::net::TcpStream::connect(("n1", PORT)).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&tls(cert_of).client));
    let mut s = connector.connect(server_name(1), tcp).await.unwrap();
    write_frame(&mut s, &hello).await.unwrap();
    s.flush().await.unwrap();
    let answer = read_frame(&mut s).await.unwrap();
    (s, answer)
}

fn hello(node: u64) -> Frame {
    hello_with(VERSION, CLUSTER, node, FINGERPRINT)
}

fn hello_with(version: u32, cluster: u64, node: u64, fingerprint: u64) -> Frame {
    Frame::Hello { version, cluster, node, fingerprint }
}

fn refusal(answer: Option<Frame>) -> String {
    match answer {
        Some(Frame::Refused { reason }) => reason,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn garbage_impostors_and_foreign_hosts_are_refused_and_harm_no_one_else() {
    let (mut sim, heard) = three_chatty(30);
    let h = Arc::clone(&heard);
    sim.client("mallory", async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Not TLS at all.
        let mut raw = turmoil::net::TcpStream::connect(("n1", PORT)).await.unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\n\r\n garbage garbage garbage").await.unwrap();
        // Node 3's certificate, claiming to be node 2.
        let (_, answer) = dial_as(3, hello(2)).await;
        assert!(refusal(answer).contains("certificate is not issued for that node"));
        // Another cluster, other settings, another protocol version.
        let (_, answer) = dial_as(2, hello_with(VERSION, 1, 2, FINGERPRINT)).await;
        assert!(refusal(answer).contains("another cluster"));
        let (_, answer) = dial_as(2, hello_with(VERSION, CLUSTER, 2, 1)).await;
        assert!(refusal(answer).contains("cluster settings differ"));
        let (_, answer) = dial_as(2, hello_with(VERSION + 1, CLUSTER, 2, FINGERPRINT)).await;
        assert!(refusal(answer).contains("protocol version"));
        // Node 2's real certificate: a message claiming to be from node 3
        // is dropped, one from node 2 is delivered, garbage ends it.
        let (mut s, answer) = dial_as(2, hello(2)).await;
        assert_eq!(answer, Some(Frame::Welcome));
        let impostor = heartbeat(3, 1, 1).write_to_bytes().unwrap();
        let own = heartbeat(2, 1, 1).write_to_bytes().unwrap();
        let (from3, from2) = {
            let g = h.lock().unwrap();
            (g.count(1, 3), g.count(1, 2))
        };
        for _ in 0..50 {
            write_frame(&mut s, &Frame::Raft(Bytes::from(impostor.clone()))).await.unwrap();
        }
        write_frame(&mut s, &Frame::Raft(Bytes::from(own))).await.unwrap();
        s.write_all(&[5, 0, 0, 0, 42, 1, 2, 3, 4]).await.unwrap();
        s.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (now3, now2) = {
            let g = h.lock().unwrap();
            (g.count(1, 3), g.count(1, 2))
        };
        // Node 3's own heartbeats go on (about 10 in 200 ms); none of the 50 forged ones counted.
        assert!(now3 - from3 < 30, "forged messages reached the engine");
        assert!(now2 > from2, "the real peer's messages still arrive");
        let closed = read_frame(&mut s).await;
        assert!(matches!(closed, Ok(None) | Err(_)), "a frame of an unknown kind closes the connection: {closed:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(heard_during(&h, 1, 2, Duration::from_secs(1)).await > 20, "the real node 2 carries on");
        assert!(heard_during(&h, 1, 3, Duration::from_secs(1)).await > 20, "and node 3");
        Ok(())
    });
    sim.run().unwrap();
}

/// Node 1's segment 7: 3.5 MiB of a known pattern.
struct Segment7;

const SEGMENT_BYTES: u64 = 3 << 20 | 1 << 19;

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

impl SegmentReader for Segment7 {
    fn read(&self, segment: u64, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        if segment != 7 {
            return Err(std::io::Error::other("no such segment"));
        }
        let end = (offset + len as u64).min(SEGMENT_BYTES + 4096);
        Ok((offset..end).map(pattern).collect())
    }
}

#[test]
fn a_snapshot_transfer_interrupted_by_a_partition_and_a_restart_resumes_where_it_stopped() {
    let mut sim = build(120);
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().to_path_buf();
    sim.host("n1", || async {
        let (_peers, mut rx) = Peers::start(Sim, config(1), tls(1), Arc::new(Segment7)).await?;
        while rx.recv().await.is_some() {}
        Ok(())
    });
    let staged = Arc::new(Mutex::new(0u64));
    let s = Arc::clone(&staged);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    sim.client("n2", async move {
        let (peers, _rx) = Peers::start(Sim, config(2), tls(2), Arc::new(NoSegments)).await?;
        let wal = DiskWal::open(&data).unwrap();
        let members = Members { cluster: CLUSTER, node: 2, segment_bytes: 4 << 20, ..Members::default() };
        let segments = vec![ManifestSegment { id: SegmentId(7), bytes: SEGMENT_BYTES, size: 4 << 20 }];
        let manifest = Manifest { index: 9, term: 2, sealed: false, segments, members };
        let staging = wal.stage(&manifest).unwrap();
        let watch = async {
            loop {
                *s.lock().unwrap() = staging.missing().unwrap().first().map_or(SEGMENT_BYTES, |m| m.1);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let copied = tokio::select! {
            copied = transfer::copy(&peers, 1, &staging, Duration::from_secs(30)) => copied,
            _ = watch => unreachable!(),
        };
        done_tx.send(copied.map(|_| staging.missing().unwrap())).unwrap();
        Ok(())
    });
    // Partition once a third has arrived, heal 2 s later, restart node 1
    // once two thirds have arrived.
    let (mut partitioned, mut repaired, mut bounced) = (None, false, false);
    let missing = loop {
        sim.step().unwrap();
        if let Ok(result) = done_rx.try_recv() {
            break result.unwrap();
        }
        let have = *staged.lock().unwrap();
        match partitioned {
            None if have > SEGMENT_BYTES / 3 => {
                sim.partition("n1", "n2");
                partitioned = Some((have, sim.elapsed()));
            }
            Some((at, when)) if !repaired && sim.elapsed() > when + Duration::from_secs(2) => {
                assert!(have - at <= 1 << 20, "nothing crossed the partition but a chunk on its way");
                sim.repair("n1", "n2");
                repaired = true;
            }
            Some(_) if repaired && !bounced && have > 2 * SEGMENT_BYTES / 3 => {
                assert!(have < SEGMENT_BYTES);
                sim.bounce("n1");
                bounced = true;
            }
            _ => {}
        }
    };
    assert!(repaired && bounced, "the transfer was interrupted both ways");
    assert!(missing.is_empty());
    let staged = std::fs::read(tmp.path().join("install/wal/00000000000000000007.seg")).unwrap();
    assert_eq!(staged.len() as u64, SEGMENT_BYTES);
    assert!(staged.iter().enumerate().all(|(i, b)| *b == pattern(i as u64)), "every byte as node 1 holds it");
}
