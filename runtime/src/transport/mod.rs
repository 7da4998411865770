//! Transports move frames between nodes. One trait, shaped after UCX tag
//! matching so that every implementation gives the same guarantees:
//!
//! - every frame carries a 64-bit [`Tag`]: the SOURCE node id in the upper
//!   bits, the view epoch (low 16 bits) in the middle, the message kind in the
//!   lower bits. The receiver learns the sender from the tag, never from the
//!   connection, so receive paths do not depend on how nodes are numbered;
//! - frames between one pair of nodes arrive in the order they were sent;
//! - [`Transport::reconcile`] brings the endpoint table in line with a view:
//!   endpoints to surviving peers are kept and re-indexed by their new node
//!   ids, endpoints to removed peers closed, new ones opened.
//!
//! `tcp` is always built; `ucx` with the cargo feature `ucx`.

mod handback;
pub mod tcp;
#[cfg(feature = "ucx")]
pub mod ucx;

use std::sync::Arc;

use ductile_coordinator::proto::{Epoch, NodeId};
/// The view and job-secret types a transport is driven with, for programs
/// that drive a transport directly (`bench_transport`).
pub use ductile_coordinator::{
    proto::{Member, View},
    secret::Secret,
};

/// Whether this build has the UCX transport (cargo feature `ucx`).
pub const UCX_BUILT: bool = cfg!(feature = "ucx");

/// Starts a UCX transport with UCX settings (names without the `UCX_`
/// prefix) over the environment's; an error in a build without the `ucx`
/// feature.
pub fn start_ucx(
    sink: Arc<dyn Sink>,
    settings: &[(&str, &str)],
) -> Result<Arc<dyn Transport>, TransportError> {
    #[cfg(feature = "ucx")]
    {
        let t: Arc<dyn Transport> = ucx::UcxTransport::with_ucx_settings(sink, settings)?;
        Ok(t)
    }
    #[cfg(not(feature = "ucx"))]
    {
        let _ = (sink, settings);
        Err(TransportError::Io {
            context: "starting UCX".into(),
            source: std::io::Error::other("this build has no UCX transport (cargo feature `ucx`)"),
        })
    }
}

/// Bits of the tag holding the source node id.
pub const SRC_BITS: u32 = 24;
/// Bits of the tag holding the low bits of the epoch.
pub const EPOCH_BITS: u32 = 16;
/// Bits of the tag holding the message kind.
pub const KIND_BITS: u32 = 24;

/// Message kinds (the tag's low bits).
pub mod kind {
    /// A runtime envelope (application or system message).
    pub const ENVELOPE: u32 = 1;
    /// A node-level frame of the rescale protocol (drain, view, barrier).
    pub const CONTROL: u32 = 2;
}

/// A 64-bit message tag: `[source node: 24][epoch: 16][kind: 24]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tag(pub u64);

impl Tag {
    /// Builds a tag. Node ids and kinds above their bit widths are a bug.
    pub fn new(src: NodeId, epoch: Epoch, kind: u32) -> Tag {
        assert!(
            src < (1 << SRC_BITS),
            "node id {src} does not fit in the tag"
        );
        assert!(
            kind < (1 << KIND_BITS),
            "message kind {kind} does not fit in the tag"
        );
        let e = epoch & ((1 << EPOCH_BITS) - 1);
        Tag(((src as u64) << (EPOCH_BITS + KIND_BITS)) | (e << KIND_BITS) | kind as u64)
    }
    /// The sending node.
    pub fn src(self) -> NodeId {
        (self.0 >> (EPOCH_BITS + KIND_BITS)) as NodeId
    }
    /// The low bits of the sender's epoch.
    pub fn epoch_bits(self) -> u64 {
        (self.0 >> KIND_BITS) & ((1 << EPOCH_BITS) - 1)
    }
    /// The message kind.
    pub fn kind(self) -> u32 {
        (self.0 & ((1 << KIND_BITS) - 1)) as u32
    }
    /// The mask a receive posts to match on kind alone, whoever sent it.
    pub const KIND_MASK: u64 = (1 << KIND_BITS) - 1;
}

/// Why a transport operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// No endpoint to that node in the current view.
    #[error("no endpoint to node {0}")]
    NoEndpoint(NodeId),
    /// A socket error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A peer failed the job-secret handshake or sent garbage.
    #[error("peer refused: {0}")]
    Handshake(String),
    /// A view entry's address is not usable by this transport.
    #[error("bad address for node {0}: {1}")]
    Address(NodeId, String),
}

/// What a reconciliation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Endpoints kept (and re-indexed).
    pub kept: usize,
    /// Endpoints opened.
    pub opened: usize,
    /// Endpoints closed.
    pub closed: usize,
}

/// Where received frames go.
pub trait Sink: Send + Sync + 'static {
    /// A frame arrived. `frame` is owned so it can be handed on without a copy.
    fn deliver(&self, tag: Tag, frame: Vec<u8>);
    /// An established peer connection ended without an orderly shutdown.
    fn lost(&self, peer_uid: u64, reason: String);
}

/// Writes the next bytes of a frame, in order: what a transport hands to
/// the caller of [`Transport::send_with`].
pub type FrameWrite<'a> = dyn FnMut(&[&[u8]]) -> std::io::Result<()> + 'a;

/// Moves frames between the nodes of a view.
pub trait Transport: Send + Sync + 'static {
    /// This node's address, as published in the view (opaque bytes).
    fn address(&self) -> Vec<u8>;
    /// Sends the concatenation of `parts` to node `to` with tag `tag`.
    fn send(&self, to: NodeId, tag: Tag, parts: &[&[u8]]) -> Result<(), TransportError>;
    /// Sends one frame whose buffer the caller hands over. A transport that
    /// completes sends after returning (UCX) keeps the buffer until then
    /// instead of copying it; the default sends it as one part.
    fn send_frame(&self, to: NodeId, tag: Tag, frame: Vec<u8>) -> Result<(), TransportError> {
        self.send(to, tag, &[&frame])
    }
    /// Sends one frame of `len` bytes that `fill` writes in pieces, in
    /// order, through the writer it is given (a message's header, then its
    /// body from the payload's own memory). Frames of one pair keep their
    /// order whatever the pieces. A transport that writes vectored (TCP)
    /// sends the pieces as they come, without a gather copy; the default
    /// gathers them into one buffer for [`Transport::send_frame`]. If `fill`
    /// fails or writes other than `len` bytes, nothing usable reaches the
    /// peer and the error is returned.
    fn send_with(
        &self,
        to: NodeId,
        tag: Tag,
        len: usize,
        fill: &mut dyn FnMut(&mut FrameWrite<'_>) -> std::io::Result<()>,
    ) -> Result<(), TransportError> {
        let mut frame = Vec::with_capacity(len);
        fill(&mut |parts: &[&[u8]]| {
            parts.iter().for_each(|p| frame.extend_from_slice(p));
            Ok(())
        })
        .map_err(|source| TransportError::Io {
            context: format!("encoding a frame for node {to}"),
            source,
        })?;
        if frame.len() != len {
            return Err(TransportError::Io {
                context: format!("encoding a frame for node {to}"),
                source: std::io::Error::other(format!(
                    "{} bytes written where {len} were announced",
                    frame.len()
                )),
            });
        }
        self.send_frame(to, tag, frame)
    }
    /// Brings endpoints in line with `view`, in which this node is `me`.
    fn reconcile(&self, view: &View, me: NodeId) -> Result<Reconciled, TransportError>;
    /// Cuts the connection to peer `peer_uid`, declared lost, at once: a
    /// send blocked on it (its buffers full of frames a hung peer never
    /// reads) fails instead of waiting forever, and so do later sends.
    /// Default: nothing, for a transport whose sends never block on a peer.
    fn disconnect(&self, _peer_uid: u64) {}
    /// Orderly shutdown: peers will not report this node as lost.
    fn shutdown(&self);
    /// Called by an idle PE while it spins: a transport progressed from the
    /// PE loop (TCP and UCX by default) moves
    /// communication along here, delivering on the calling thread. True
    /// when something happened (a frame, or a piece of one): an idle PE
    /// polls on while it does, past its spin. Default: nothing to do.
    fn poll(&self) -> bool {
        false
    }
    /// How long an idle PE watches only its inbox before it starts calling
    /// [`Transport::poll`]: for a transport whose progress costs system
    /// calls (TCP), a reply from a PE of the same node should not wait
    /// behind them. Default: none, the PE polls at once.
    fn progress_after(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// An idle PE starts (`true`) or stops spinning, around its calls to
    /// [`Transport::poll`]: a transport may leave its own thread out of
    /// receiving meanwhile (TCP), and must take it back before the PE runs
    /// anything. Default: nothing to do.
    fn pe_spinning(&self, _spinning: bool) {}
    /// A PE that spun progressing the transport found nothing and is about
    /// to sleep. True: it keeps the transport and sleeps on
    /// [`Transport::wait_fd`] (no other PE of the node holds it). False:
    /// another PE does, and this one has let go, as `pe_spinning(false)`
    /// would: it sleeps on its inbox alone, and what comes for it reaches
    /// it through that PE (or the transport's thread). One sleeper per node
    /// on the descriptor: every arrival woke all of them. Default: true.
    fn pe_sleeps(&self) -> bool {
        true
    }
    /// A descriptor that turns readable when frames wait to be read by
    /// [`Transport::poll`], for an idle PE that has spun out to sleep on
    /// together with its inbox: the frame then wakes the PE, which reads it
    /// itself. Asked right before each sleep (UCX arms its worker here),
    /// and valid only between the PE's `pe_spinning(true)` and
    /// `pe_spinning(false)` (while the transport's own thread is out of
    /// receiving). Default: none, the PE sleeps on its inbox alone and
    /// frames reach it through the transport's thread.
    fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
    /// The longest an idle PE may sleep on [`Transport::wait_fd`] now:
    /// work in flight whose next step no event announces (UCX: a send
    /// waiting for room in a peer's queue), or an arrival the descriptor
    /// may miss (UCX over shared memory), needs the PE to progress again
    /// after that long. Asked right after `wait_fd`. Default: no limit.
    fn wait_limit(&self) -> Option<std::time::Duration> {
        None
    }
}

/// This thread's kernel id, from /proc/thread-self (0 if unreadable): lets
/// tests find a transport's own threads among the test process's.
pub(crate) fn current_tid() -> u64 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time (ns) thread `tid` of this process has used, from its schedstat.
#[cfg(test)]
pub(crate) fn thread_cpu_ns(tid: u64) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Two threads that act as the idle PEs of one node, for the transports'
/// tests: each in turn starts spinning, polls the transport (50 and 80
/// times), and stops, until [`SpinningPes::stop`].
#[cfg(test)]
pub(crate) struct SpinningPes {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

#[cfg(test)]
impl SpinningPes {
    pub(crate) fn start(t: Arc<dyn Transport>) -> SpinningPes {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..2)
            .map(|k| {
                let (t, stop) = (t.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        t.pe_spinning(true);
                        for _ in 0..50 + k * 30 {
                            t.poll();
                        }
                        t.pe_spinning(false);
                        std::thread::yield_now();
                    }
                })
            })
            .collect();
        SpinningPes { stop, threads }
    }

    /// Ends both, each after it stopped spinning.
    pub(crate) fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.threads {
            t.join().expect("a spinning PE panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A transport that only takes whole frames: the default `send_with`.
    struct Whole(std::sync::Mutex<Vec<Vec<u8>>>);
    impl Transport for Whole {
        fn address(&self) -> Vec<u8> {
            vec![]
        }
        fn send(&self, _: NodeId, _: Tag, parts: &[&[u8]]) -> Result<(), TransportError> {
            self.0.lock().unwrap().push(parts.concat());
            Ok(())
        }
        fn reconcile(&self, _: &View, _: NodeId) -> Result<Reconciled, TransportError> {
            Ok(Reconciled::default())
        }
        fn shutdown(&self) {}
    }

    #[test]
    fn the_default_send_with_gathers_the_pieces_into_one_frame_and_checks_its_length() {
        let t = Whole(Default::default());
        let big = vec![9u8; 100_000];
        t.send_with(1, Tag(0), 100_005, &mut |w| {
            w(&[b"ab", &big])?;
            w(&[b"cde"])
        })
        .unwrap();
        let sent = t.0.lock().unwrap().clone();
        assert_eq!(sent.len(), 1);
        assert_eq!(&sent[0][..2], b"ab");
        assert_eq!(&sent[0][100_002..], b"cde");
        let short = t.send_with(1, Tag(0), 10, &mut |w| w(&[b"abc"]));
        assert!(short.unwrap_err().to_string().contains("were announced"));
        let failed = t.send_with(1, Tag(0), 3, &mut |_| {
            Err(std::io::Error::other("bad body"))
        });
        assert!(failed.unwrap_err().to_string().contains("bad body"));
        assert_eq!(t.0.lock().unwrap().len(), 1, "nothing sent for either");
    }

    proptest! {
        #[test]
        fn tag_fields_roundtrip(src in 0u32..(1 << SRC_BITS), epoch: u64, kind in 0u32..(1 << KIND_BITS)) {
            let t = Tag::new(src, epoch, kind);
            prop_assert_eq!(t.src(), src);
            prop_assert_eq!(t.kind(), kind);
            prop_assert_eq!(t.epoch_bits(), epoch & 0xffff);
            // A receive posted on the kind alone matches whatever the sender's id.
            prop_assert_eq!(t.0 & Tag::KIND_MASK, Tag::new(0, 0, kind).0);
        }
    }
}
