//! Clustered mode's peer transport: raft messages and snapshot segments
//! between hosts, over TCP with mutual TLS.
//!
//! Each host dials every other host it knows an address for and sends its
//! raft messages on that connection (`Peers::send`, never blocking: a
//! bounded queue per peer, a full queue drops the message, and raft
//! retransmits); it accepts connections on its own address only and
//! reads the other hosts' messages from them. A connection is trusted
//! only after the TLS handshake (both certificates from the cluster's CA)
//! and a `Hello` whose node id the dialing host's certificate is issued
//! for, in the same cluster, at the same protocol version and with the
//! same cluster settings (`fingerprint`); a raft message whose `from` is
//! not that node is dropped. A connection that breaks is dialled again
//! with backoff; nothing is assumed delivered because it was written.
//!
//! A snapshot's segments travel on the same connections: the installing
//! host asks its leader for chunks (`fetch`) on the connection it dialled,
//! and the leader answers on it. The code is generic over the network
//! (`Net`), so the tests run it over turmoil's simulated one.

pub mod tls;
pub mod transfer;
pub mod wire;

use bytes::Bytes;
use protobuf::Message as _;
use skippr_core::PeerMessage;
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tls::{issued_for, server_name, Tls};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};
use wire::{read_frame, write_frame, Frame, CHUNK_BYTES, VERSION};

/// How connections are made: real TCP (`TokioNet`) or a simulated network.
pub trait Net: Clone + Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    type Listener: Send + 'static;
    fn bind(&self, addr: &str) -> impl Future<Output = io::Result<Self::Listener>> + Send;
    fn accept(listener: &mut Self::Listener) -> impl Future<Output = io::Result<(Self::Stream, String)>> + Send;
    fn connect(&self, addr: &str) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

/// TCP on the host's network stack, without Nagle's delay (raft's messages
/// are small and waited for).
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioNet;

impl Net for TokioNet {
    type Stream = tokio::net::TcpStream;
    type Listener = tokio::net::TcpListener;

    async fn bind(&self, addr: &str) -> io::Result<Self::Listener> {
        tokio::net::TcpListener::bind(addr).await
    }

    async fn accept(listener: &mut Self::Listener) -> io::Result<(Self::Stream, String)> {
        let (stream, from) = listener.accept().await?;
        stream.set_nodelay(true)?;
        Ok((stream, from.to_string()))
    }

    async fn connect(&self, addr: &str) -> io::Result<Self::Stream> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

/// Who this host is and whom it talks to.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    pub node: u64,
    pub cluster: u64,
    /// Every host's address, this one's included (it listens there).
    pub peers: BTreeMap<u64, String>,
    /// A hash of the settings every host must share; a peer with another
    /// is refused.
    pub fingerprint: u64,
    /// Frames queued per peer before further messages are dropped.
    pub queue: usize,
    /// How long a connection attempt (TCP, TLS, hello) may take.
    pub connect_timeout: Duration,
    /// How long a chunk request waits for its answer.
    pub fetch_timeout: Duration,
    /// How often a dialing host pings an accepting one.
    pub keepalive: Duration,
    /// A connection on which nothing arrived for this long is closed (and
    /// dialled again): bytes were lost, or the peer stopped.
    pub dead_after: Duration,
}

impl PeerConfig {
    pub fn new(node: u64, cluster: u64, peers: BTreeMap<u64, String>, fingerprint: u64) -> PeerConfig {
        PeerConfig {
            node,
            cluster,
            peers,
            fingerprint,
            queue: 4096,
            connect_timeout: Duration::from_secs(5),
            fetch_timeout: Duration::from_secs(10),
            keepalive: Duration::from_millis(500),
            dead_after: Duration::from_secs(3),
        }
    }
}

/// What arrives from peers for the engine.
#[derive(Debug)]
pub enum Incoming {
    Raft(Box<PeerMessage>),
    /// Node `to` ended the transfer of this host's snapshot.
    Served {
        to: u64,
        ok: bool,
    },
    /// Node `node` asks to join in place of `replaces`.
    Join {
        node: u64,
        replaces: u64,
    },
    /// Node `by` says node `node` (this host) was removed from the cluster.
    Removed {
        by: u64,
        node: u64,
    },
}

/// Reads the bytes of this host's segments for a peer's snapshot install.
pub trait SegmentReader: Send + Sync + 'static {
    fn read(&self, segment: u64, offset: u64, len: usize) -> io::Result<Vec<u8>>;
}

impl SegmentReader for crate::DiskWal {
    fn read(&self, segment: u64, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.read_range(skippr_core::SegmentId(segment), offset, len)
    }
}

type Pending = Arc<Mutex<BTreeMap<u64, oneshot::Sender<Result<Bytes, String>>>>>;
/// Each accepted connection's queue of answers, by the node that dialed it
/// (the latest connection of each).
type Answers = Arc<Mutex<BTreeMap<u64, mpsc::Sender<Frame>>>>;

struct Outbound {
    queue: mpsc::Sender<Frame>,
    pending: Pending,
}

/// A running transport. Dropping it stops its tasks.
pub struct Peers {
    outbound: BTreeMap<u64, Outbound>,
    answers: Answers,
    next_request: AtomicU64,
    tasks: Vec<JoinHandle<()>>,
    fetch_timeout: Duration,
}

impl Drop for Peers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Peers {
    /// Binds this host's address, then starts accepting and dialling.
    /// Messages for the engine arrive on the receiver.
    pub async fn start<N: Net>(
        net: N,
        cfg: PeerConfig,
        tls: Tls,
        reader: Arc<dyn SegmentReader>,
    ) -> io::Result<(Peers, mpsc::Receiver<Incoming>)> {
        let own = cfg.peers.get(&cfg.node).ok_or_else(|| io::Error::other("this node has no address"))?.clone();
        let listener =
            net.bind(&own).await.map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {own}: {e}")))?;
        let (incoming, rx) = mpsc::channel(1024);
        let cfg = Arc::new(cfg);
        let answers = Answers::default();
        let accepting =
            accept_loop::<N>(listener, Arc::clone(&cfg), tls.clone(), reader, incoming.clone(), Arc::clone(&answers));
        let mut tasks = vec![tokio::spawn(accepting)];
        let mut outbound = BTreeMap::new();
        for (&peer, addr) in cfg.peers.iter().filter(|(id, _)| **id != cfg.node) {
            let (queue, frames) = mpsc::channel(cfg.queue);
            let out = Outbound { queue, pending: Pending::default() };
            let dial = Dial {
                net: net.clone(),
                cfg: Arc::clone(&cfg),
                tls: tls.clone(),
                peer,
                addr: addr.clone(),
                pending: Arc::clone(&out.pending),
                incoming: incoming.clone(),
            };
            tasks.push(tokio::spawn(dial.run(frames)));
            outbound.insert(peer, out);
        }
        let fetch_timeout = cfg.fetch_timeout;
        Ok((Peers { outbound, answers, next_request: AtomicU64::new(1), tasks, fetch_timeout }, rx))
    }

    /// Queues a raft message for its peer; dropped if the queue is full or
    /// the peer has no address here (raft sends again).
    pub fn send(&self, m: &PeerMessage) {
        let Some(out) = self.outbound.get(&m.to) else {
            debug!(to = m.to, "a raft message for a node without an address in SKIPPR_CLUSTER_PEERS; dropped");
            return;
        };
        let bytes = match m.write_to_bytes() {
            Ok(b) => Bytes::from(b),
            Err(e) => return error!(error = %e, "a raft message does not encode; dropped"),
        };
        // A full queue: the peer is slow or away; raft sends again.
        let _ = out.queue.try_send(Frame::Raft(bytes));
    }

    /// Asks `peer` for up to `len` bytes of its `segment` from `offset`.
    /// Fails if there is no connection, it breaks, or the answer takes too
    /// long; the caller resumes from what it has.
    pub async fn fetch(&self, peer: u64, segment: u64, offset: u64, len: u32) -> Result<Bytes, String> {
        let out = self.outbound.get(&peer).ok_or_else(|| format!("node {peer} has no address here"))?;
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        out.pending.lock().expect("not poisoned").insert(request, tx);
        let frame = Frame::Fetch { request, segment, offset, len: len.min(CHUNK_BYTES) };
        if out.queue.try_send(frame).is_err() {
            out.pending.lock().expect("not poisoned").remove(&request);
            return Err(format!("the queue to node {peer} is full"));
        }
        let answer = tokio::time::timeout(self.fetch_timeout, rx).await;
        out.pending.lock().expect("not poisoned").remove(&request);
        match answer {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(format!("the connection to node {peer} broke")),
            Err(_) => Err(format!("node {peer} did not answer within {:?}", self.fetch_timeout)),
        }
    }

    /// Waits (at most `within`) until every queue is empty, and a little
    /// more for the last frames to be written: an engine's last answers
    /// (`--once`: the commit index that lets its leader stop) leave before
    /// the process exits. A peer that is away keeps its queue; raft never
    /// counted on it.
    pub async fn flush(&self, within: Duration) {
        let empty = || self.outbound.values().all(|o| o.queue.capacity() == o.queue.max_capacity());
        let deadline = tokio::time::Instant::now() + within;
        while !empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50).min(within)).await;
    }

    /// Asks every peer to let this host (`node`, a joining host) in in
    /// place of `replaces`; the leader acts on it, the others refuse (the
    /// asker asks again until its own configuration has it as a voter).
    pub fn ask_to_join(&self, node: u64, replaces: u64) {
        for out in self.outbound.values() {
            let _ = out.queue.try_send(Frame::Join { node, replaces });
        }
    }

    /// Tells node `node`, which dialed this host and was removed from the
    /// cluster, that it was: on the connection it dialed (no other host
    /// dials a removed id). Dropped if it has none now; it sends again.
    pub fn tell_removed(&self, node: u64) {
        if let Some(answers) = self.answers.lock().expect("not poisoned").get(&node) {
            let _ = answers.try_send(Frame::Removed { node });
        }
    }

    /// Tells `peer` that the transfer of its snapshot ended.
    pub fn transfer_ended(&self, peer: u64, ok: bool) {
        if let Some(out) = self.outbound.get(&peer) {
            let _ = out.queue.try_send(Frame::TransferEnded { ok });
        }
    }
}

/// One outbound connection's life, again and again.
struct Dial<N: Net> {
    net: N,
    cfg: Arc<PeerConfig>,
    tls: Tls,
    peer: u64,
    addr: String,
    pending: Pending,
    incoming: mpsc::Sender<Incoming>,
}

const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A warning about the same peer at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

impl<N: Net> Dial<N> {
    async fn run(self, mut frames: mpsc::Receiver<Frame>) {
        let mut backoff = BACKOFF_MIN;
        let mut warned: Option<tokio::time::Instant> = None;
        let mut was_up = false;
        loop {
            match self.connect().await {
                Ok(stream) => {
                    backoff = BACKOFF_MIN;
                    if !was_up || warned.is_some() {
                        info!(peer = self.peer, addr = %self.addr, "connected to peer");
                    }
                    (was_up, warned) = (true, None);
                    let why = self.exchange(stream, &mut frames).await;
                    info!(peer = self.peer, addr = %self.addr, reason = %why, "connection to peer closed; dialling again");
                }
                Err(Failure::Refused(reason)) => {
                    if warned.is_none_or(|w| w.elapsed() >= WARN_EVERY) {
                        error!(peer = self.peer, addr = %self.addr, "peer refused this host: {reason}");
                        warned = Some(tokio::time::Instant::now());
                    }
                    backoff = BACKOFF_MAX;
                }
                Err(Failure::Io(e)) => {
                    if warned.is_none_or(|w| w.elapsed() >= WARN_EVERY) {
                        warn!(peer = self.peer, addr = %self.addr, error = %e, "cannot reach peer; retrying");
                        warned = Some(tokio::time::Instant::now());
                    }
                }
            }
            // What was queued meanwhile is stale: raft sends again.
            self.discard(&mut frames);
            tokio::time::sleep(jittered(backoff)).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    async fn connect(&self) -> Result<tokio_rustls::client::TlsStream<N::Stream>, Failure> {
        let attempt = async {
            let tcp = self.net.connect(&self.addr).await?;
            let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.tls.client));
            let mut tls = connector.connect(server_name(self.peer), tcp).await?;
            let hello = Frame::Hello {
                version: VERSION,
                cluster: self.cfg.cluster,
                node: self.cfg.node,
                fingerprint: self.cfg.fingerprint,
            };
            write_frame(&mut tls, &hello).await?;
            tls.flush().await?;
            match read_frame(&mut tls).await? {
                Some(Frame::Welcome) => Ok(tls),
                Some(Frame::Refused { reason }) => Err(Failure::Refused(reason)),
                Some(other) => Err(Failure::Refused(format!("it answered the hello with {other:?}"))),
                None => Err(Failure::Io(io::Error::from(io::ErrorKind::UnexpectedEof))),
            }
        };
        match tokio::time::timeout(self.cfg.connect_timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(Failure::Io(io::Error::new(io::ErrorKind::TimedOut, "no answer to the hello"))),
        }
    }

    /// Writes queued frames and reads chunk answers until the connection
    /// breaks; returns why.
    async fn exchange(
        &self,
        stream: tokio_rustls::client::TlsStream<N::Stream>,
        frames: &mut mpsc::Receiver<Frame>,
    ) -> String {
        let (mut r, w) = tokio::io::split(stream);
        let mut w = BufWriter::with_capacity(64 << 10, w);
        let mut keepalive = tokio::time::interval(self.cfg.keepalive);
        let write = async {
            loop {
                let frame = tokio::select! {
                    frame = frames.recv() => match frame {
                        Some(frame) => frame,
                        None => return "the transport stopped".to_string(),
                    },
                    _ = keepalive.tick() => Frame::Ping,
                };
                if let Err(e) = write_frame(&mut w, &frame).await {
                    return e.to_string();
                }
                while let Ok(frame) = frames.try_recv() {
                    if let Err(e) = write_frame(&mut w, &frame).await {
                        return e.to_string();
                    }
                }
                if let Err(e) = w.flush().await {
                    return e.to_string();
                }
            }
        };
        let read = async {
            loop {
                let Ok(frame) = tokio::time::timeout(self.cfg.dead_after, read_frame(&mut r)).await else {
                    return format!("nothing arrived for {:?}", self.cfg.dead_after);
                };
                let (request, answer) = match frame {
                    Ok(Some(Frame::Pong)) => continue,
                    Ok(Some(Frame::Chunk { request, bytes })) => (request, Ok(bytes)),
                    Ok(Some(Frame::ChunkFailed { request, reason })) => (request, Err(reason)),
                    Ok(Some(Frame::Removed { node })) => {
                        let told = Incoming::Removed { by: self.peer, node };
                        if self.incoming.send(told).await.is_err() {
                            return "the engine stopped".to_string();
                        }
                        continue;
                    }
                    Ok(Some(other)) => {
                        return format!("the peer sent {} where only chunks may come", kind_name(&other));
                    }
                    Ok(None) => return "the peer closed it".to_string(),
                    Err(e) => return e.to_string(),
                };
                if let Some(tx) = self.pending.lock().expect("not poisoned").remove(&request) {
                    let _ = tx.send(answer);
                }
            }
        };
        let why = tokio::select! { why = write => why, why = read => why };
        self.pending.lock().expect("not poisoned").clear();
        why
    }

    fn discard(&self, frames: &mut mpsc::Receiver<Frame>) {
        while frames.try_recv().is_ok() {}
        self.pending.lock().expect("not poisoned").clear();
    }
}

enum Failure {
    Io(io::Error),
    Refused(String),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Io(e)
    }
}

fn kind_name(f: &Frame) -> &'static str {
    match f {
        Frame::Hello { .. } => "a hello",
        Frame::Welcome => "a welcome",
        Frame::Refused { .. } => "a refusal",
        Frame::Raft(_) => "a raft message",
        Frame::Fetch { .. } => "a chunk request",
        Frame::Chunk { .. } => "a chunk",
        Frame::ChunkFailed { .. } => "a failed chunk",
        Frame::TransferEnded { .. } => "a transfer's end",
        Frame::Join { .. } => "a join request",
        Frame::Ping => "a ping",
        Frame::Pong => "a pong",
        Frame::Removed { .. } => "a removal",
    }
}

/// Backoff with up to a quarter of jitter, from the clock's low bits (the
/// shell and io may use such entropy; core and the simulator may not).
fn jittered(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.subsec_nanos());
    d + d.mul_f64((nanos % 1000) as f64 / 4000.0)
}

async fn accept_loop<N: Net>(
    mut listener: N::Listener,
    cfg: Arc<PeerConfig>,
    tls: Tls,
    reader: Arc<dyn SegmentReader>,
    incoming: mpsc::Sender<Incoming>,
    answers: Answers,
) {
    loop {
        match N::accept(&mut listener).await {
            Ok((stream, from)) => {
                let inbound = Inbound {
                    cfg: Arc::clone(&cfg),
                    tls: tls.clone(),
                    reader: Arc::clone(&reader),
                    incoming: incoming.clone(),
                    answers: Arc::clone(&answers),
                    from,
                };
                tokio::spawn(inbound.run(stream));
            }
            Err(e) => {
                warn!(error = %e, "accepting a peer connection failed");
                tokio::time::sleep(BACKOFF_MIN).await;
            }
        }
    }
}

/// One accepted connection.
struct Inbound {
    cfg: Arc<PeerConfig>,
    tls: Tls,
    reader: Arc<dyn SegmentReader>,
    incoming: mpsc::Sender<Incoming>,
    answers: Answers,
    /// The remote address, for the log.
    from: String,
}

impl Inbound {
    async fn run<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(self, stream: S) {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&self.tls.server));
        let greeted = async {
            let mut tls = acceptor.accept(stream).await?;
            let hello = read_frame(&mut tls).await?;
            Ok::<_, io::Error>((tls, hello))
        };
        let (mut tls, hello) = match tokio::time::timeout(self.cfg.connect_timeout, greeted).await {
            Ok(Ok(greeted)) => greeted,
            Ok(Err(e)) => {
                return warn!(from = %self.from, error = %e, "a peer connection failed before its hello");
            }
            Err(_) => return warn!(from = %self.from, "a peer connection sent no hello in time; closed"),
        };
        let node = match self.check(&tls, hello) {
            Ok(node) => node,
            Err(reason) => {
                warn!(from = %self.from, "refused a peer connection: {reason}");
                let _ = write_frame(&mut tls, &Frame::Refused { reason }).await;
                let _ = tls.shutdown().await;
                return;
            }
        };
        if write_frame(&mut tls, &Frame::Welcome).await.is_err() || tls.flush().await.is_err() {
            return;
        }
        debug!(peer = node, from = %self.from, "peer connected");
        let why = self.serve(node, tls).await;
        debug!(peer = node, from = %self.from, reason = %why, "peer connection closed");
    }

    /// The node a hello may speak for, or why not.
    fn check<S>(&self, tls: &tokio_rustls::server::TlsStream<S>, hello: Option<Frame>) -> Result<u64, String> {
        let Some(Frame::Hello { version, cluster, node, fingerprint }) = hello else {
            return Err("it did not begin with a hello".into());
        };
        if version != VERSION {
            return Err(format!("it speaks peer protocol version {version}; this host speaks {VERSION}"));
        }
        if cluster != self.cfg.cluster {
            return Err(format!(
                "it belongs to cluster {cluster:016x}, this host to cluster {:016x}: its DATA_DIR was initialized for \
                 another cluster",
                self.cfg.cluster
            ));
        }
        if fingerprint != self.cfg.fingerprint {
            return Err(format!(
                "its cluster settings differ from this host's (fingerprint {fingerprint:016x}, here {:016x}): every \
                 host needs the same segment size and raft timing",
                self.cfg.fingerprint
            ));
        }
        if node == self.cfg.node {
            return Err(format!("it claims this host's own node id {node}: two hosts share one id"));
        }
        let cert = tls.get_ref().1.peer_certificates().and_then(|c| c.first());
        if !cert.is_some_and(|c| issued_for(c, node)) {
            return Err(format!("it says it is node {node}, but its certificate is not issued for that node"));
        }
        Ok(node)
    }

    /// Reads the peer's frames until the connection ends: raft messages to
    /// the engine, chunk requests answered on the connection.
    async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        &self,
        node: u64,
        tls: tokio_rustls::server::TlsStream<S>,
    ) -> String {
        let (mut r, mut w) = tokio::io::split(tls);
        let (answers, mut to_write) = mpsc::channel::<Frame>(4);
        self.answers.lock().expect("not poisoned").insert(node, answers.clone());
        let writer = tokio::spawn(async move {
            while let Some(frame) = to_write.recv().await {
                if write_frame(&mut w, &frame).await.is_err() || w.flush().await.is_err() {
                    break;
                }
            }
        });
        let mut impostor_warned: Option<tokio::time::Instant> = None;
        let why = loop {
            let Ok(frame) = tokio::time::timeout(self.cfg.dead_after, read_frame(&mut r)).await else {
                break format!("nothing arrived for {:?}", self.cfg.dead_after);
            };
            let frame = match frame {
                Ok(Some(f)) => f,
                Ok(None) => break "the peer closed it".to_string(),
                Err(e) => {
                    break format!("unreadable frame: {e}");
                }
            };
            match frame {
                Frame::Raft(bytes) => {
                    let m = match PeerMessage::parse_from_carllerche_bytes(&bytes) {
                        Ok(m) => m,
                        Err(e) => {
                            break format!("a raft message that does not decode: {e}");
                        }
                    };
                    if m.from != node || m.to != self.cfg.node {
                        if impostor_warned.is_none_or(|w| w.elapsed() >= WARN_EVERY) {
                            warn!(
                                peer = node,
                                from = m.from,
                                to = m.to,
                                "dropped a raft message not from the connection's node or not for this host"
                            );
                            impostor_warned = Some(tokio::time::Instant::now());
                        }
                        continue;
                    }
                    if self.incoming.send(Incoming::Raft(Box::new(m))).await.is_err() {
                        break "the engine stopped".to_string();
                    }
                }
                Frame::Fetch { request, segment, offset, len } => {
                    let reader = Arc::clone(&self.reader);
                    let answers = answers.clone();
                    tokio::spawn(async move {
                        let len = len.min(CHUNK_BYTES) as usize;
                        let read = tokio::task::spawn_blocking(move || reader.read(segment, offset, len)).await;
                        let answer = match read {
                            Ok(Ok(bytes)) => Frame::Chunk { request, bytes: Bytes::from(bytes) },
                            Ok(Err(e)) => Frame::ChunkFailed { request, reason: e.to_string() },
                            Err(e) => Frame::ChunkFailed { request, reason: e.to_string() },
                        };
                        let _ = answers.send(answer).await;
                    });
                }
                Frame::Ping => {
                    if answers.try_send(Frame::Pong).is_err() {
                        debug!(peer = node, "a ping not answered: chunks are on their way");
                    }
                }
                Frame::TransferEnded { ok } => {
                    if self.incoming.send(Incoming::Served { to: node, ok }).await.is_err() {
                        break "the engine stopped".to_string();
                    }
                }
                Frame::Join { node: joining, replaces } if joining == node => {
                    if self.incoming.send(Incoming::Join { node, replaces }).await.is_err() {
                        break "the engine stopped".to_string();
                    }
                }
                other => {
                    break format!("the peer sent {} on an open connection", kind_name(&other));
                }
            }
        };
        writer.abort();
        let mut by_node = self.answers.lock().expect("not poisoned");
        if by_node.get(&node).is_some_and(|a| a.same_channel(&answers)) {
            by_node.remove(&node);
        }
        why
    }
}
