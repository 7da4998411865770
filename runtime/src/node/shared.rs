//! The state every thread of a node shares ([`NodeShared`]), and the sink
//! through which the transport hands it frames: control frames go to the
//! node's main thread, envelope frames to their PE's inbox, and those that
//! come before the node's first view wait in a buffer until it is installed.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use ductile_coordinator::proto::{ServerMsg, View};
use tracing::{debug, error, info};

use crate::msg::{CollId, decode_frame};
use crate::operation::OperationSlot;
use crate::options::Options;
use crate::pe::Inbox;
use crate::registry::Registry;
use crate::rescale::driver::Counts;
use crate::rescale::{ControlFrame, Desk, FrameCounts, NodeEvent};
use crate::topo::Topology;
use crate::transport::{Sink, Tag, Transport, TransportError, kind};

/// State shared by every thread of a node.
pub(crate) struct NodeShared {
    pub registry: Arc<Registry>,
    pub inboxes: Vec<Inbox>,
    pub readonly: Mutex<HashMap<u64, Arc<dyn Any + Send + Sync>>>,
    pub args: Vec<String>,
    pub options: Options,
    topo: Mutex<Option<Arc<Topology>>>,
    /// Envelope frames that arrived before this node's first view, in
    /// arrival order. The transport's receive thread must never wait (one
    /// thread serves every peer and accepts new ones: a wait there stalls
    /// the handshakes of peers that are themselves waiting to connect), so
    /// such frames wait here and are delivered when the view is installed.
    /// Taken before `topo` wherever both are.
    early: Mutex<Vec<(Tag, Vec<u8>)>>,
    view: Mutex<Option<View>>,
    pub(super) transport: OnceLock<Arc<dyn Transport>>,
    pub(super) uid: AtomicU64,
    next_coll: AtomicU32,
    aborting: AtomicBool,
    abort_reason: Mutex<Option<String>>,
    pub(super) finished: AtomicBool,
    /// Node 0: the rescale or checkpoint in flight (one at a time).
    pub(crate) operation: OperationSlot,
    /// Envelope frames per peer in this epoch (the rescale's drain counts them).
    frames: Mutex<FrameCounts>,
    draining: AtomicBool,
    pub(super) events: crossbeam_channel::Sender<NodeEvent>,
    /// The member lost without notice that the node is recovering from:
    /// its node id, uid, and when the driver began the recovery.
    loss: Mutex<Option<(u32, u64, std::time::Instant)>>,
}

impl NodeShared {
    pub(super) fn new(
        registry: Arc<Registry>,
        pes: u32,
        args: Vec<String>,
        options: Options,
        events: crossbeam_channel::Sender<NodeEvent>,
    ) -> std::io::Result<Self> {
        Ok(NodeShared {
            registry,
            inboxes: (0..pes).map(|_| Inbox::new()).collect::<std::io::Result<_>>()?,
            readonly: Mutex::new(HashMap::new()),
            args,
            options,
            topo: Mutex::new(None),
            early: Mutex::new(Vec::new()),
            view: Mutex::new(None),
            transport: OnceLock::new(),
            uid: AtomicU64::new(0),
            next_coll: AtomicU32::new(1),
            aborting: AtomicBool::new(false),
            abort_reason: Mutex::new(None),
            finished: AtomicBool::new(false),
            operation: OperationSlot::default(),
            frames: Mutex::new(FrameCounts::default()),
            draining: AtomicBool::new(false),
            events,
            loss: Mutex::new(None),
        })
    }

    /// Gives a node of [`NodeShared::for_tests`] its transport.
    #[cfg(test)]
    pub(crate) fn set_transport_for_tests(&self, transport: Arc<dyn Transport>) {
        assert!(self.transport.set(transport).is_ok(), "a transport already");
    }

    /// A standalone node of `pes` PEs with nothing registered, for tests
    /// that run a PE's loop.
    #[cfg(test)]
    pub(crate) fn for_tests(pes: u32) -> Arc<Self> {
        let (events, _) = crossbeam_channel::unbounded();
        let node = Arc::new(NodeShared::new(
            Arc::new(Registry::new()),
            pes,
            Vec::new(),
            Options::default(),
            events,
        )
        .expect("eventfds for the PEs' inboxes"));
        node.install(Arc::new(Topology::standalone(pes)));
        node
    }

    /// Installs `view`, in which this node is `me`, as the current one.
    pub(crate) fn install_view(&self, view: View, me: u32) -> Arc<Topology> {
        let topo = Arc::new(Topology::new(&view, me));
        *self.view.lock().expect("view lock poisoned") = Some(view);
        *self.frames.lock().expect("frame counts poisoned") = FrameCounts::default();
        self.install(topo.clone());
        topo
    }

    /// The installed topology, if there is one yet (a newcomer waiting has none).
    pub(crate) fn topology_now(&self) -> Option<Arc<Topology>> {
        self.topo.lock().expect("topology lock poisoned").clone()
    }

    /// The installed topology.
    pub(crate) fn current_topology(&self) -> Arc<Topology> {
        self.topology_now()
            .expect("topology installed before it is asked for")
    }

    /// The transport, once there is one (a standalone node has none).
    /// Borrowed, not cloned: every idle PE asks, and a clone's reference
    /// count is a cache line that all of a node's PEs would write.
    pub(crate) fn transport_if_any(&self) -> Option<&dyn Transport> {
        self.transport.get().map(|t| &**t)
    }

    pub(crate) fn transport(&self) -> Arc<dyn Transport> {
        self.transport
            .get()
            .expect("members have a transport")
            .clone()
    }

    /// Sends a rescale-protocol frame to `node`, tagged with `epoch`.
    pub(crate) fn send_control(
        &self,
        node: u32,
        epoch: u64,
        frame: &ControlFrame,
    ) -> Result<(), TransportError> {
        let me = self.current_topology().my_node();
        let body = postcard::to_allocvec(frame).expect("encoding into a Vec cannot fail");
        self.transport()
            .send(node, Tag::new(me, epoch, kind::CONTROL), &[&body])
    }

    /// Envelope frames sent to and received from each of the first
    /// `nodes` node ids in this epoch (what the rescale's drain compares).
    pub(crate) fn frame_counts(&self, nodes: u32) -> Counts {
        let f = self.frames.lock().expect("frame counts poisoned");
        let get = |m: &HashMap<u32, u64>, n: u32| m.get(&n).copied().unwrap_or(0);
        Counts {
            sent: (0..nodes).map(|n| get(&f.sent, n)).collect(),
            received: (0..nodes).map(|n| get(&f.received, n)).collect(),
        }
    }

    pub(crate) fn set_draining(&self, on: bool) {
        self.draining.store(on, Ordering::SeqCst);
    }

    /// Runs `f` on the desk of the rescale being served, if any.
    pub(crate) fn with_desk<R>(&self, f: impl FnOnce(&mut Desk) -> R) -> Option<R> {
        self.operation.with_rescale(f)
    }

    /// Answers the rescale being served (no-op when none is).
    pub(crate) fn finish_rescale(&self, result: Result<(), crate::rescale::RescaleFailed>) {
        let desk = self.operation.take_rescale();
        if let (Some(desk), Some(view)) = (desk, self.view()) {
            desk.answer(&view, result);
        }
    }

    /// Installs `topo`, then delivers the frames that came before the
    /// first one, all under the `early` lock: a frame that arrives
    /// meanwhile waits for them, so every pair's order holds.
    pub(super) fn install(&self, topo: Arc<Topology>) {
        let mut early = self.early.lock().expect("early frames poisoned");
        *self.topo.lock().expect("topology lock poisoned") = Some(topo.clone());
        for (tag, frame) in early.drain(..) {
            self.deliver_envelope(&topo, tag, frame);
        }
    }

    /// The current membership view (None before the job started or standalone).
    pub(crate) fn view(&self) -> Option<View> {
        self.view.lock().expect("view lock poisoned").clone()
    }

    /// Hands an envelope frame to its PE's inbox and counts it.
    fn deliver_envelope(&self, topo: &Topology, tag: Tag, frame: Vec<u8>) {
        match decode_frame(topo, tag, frame) {
            Ok((rank, env)) => self.inboxes[rank].push(env),
            Err(e) => error!("dropping a frame from node {}: {e}", tag.src()),
        }
        *self
            .frames
            .lock()
            .expect("frame counts poisoned")
            .received
            .entry(tag.src())
            .or_insert(0) += 1;
        if self.draining.load(Ordering::SeqCst) {
            let _ = self.events.send(NodeEvent::Counted);
        }
    }

    /// A fresh job-wide collection id: this node's uid and a local counter.
    pub(crate) fn new_collection_id(&self) -> CollId {
        let n = self.next_coll.fetch_add(1, Ordering::Relaxed);
        ((self.uid.load(Ordering::Relaxed) + 1) << 32) | n as u64
    }

    /// Sends `env`, for PE `dest_pe`, to `node` as one frame, written
    /// through the transport in pieces (`msg::write_frame`: a large body
    /// from the message's own memory).
    pub(crate) fn send_to_node(
        &self,
        node: u32,
        dest_pe: crate::topo::Pe,
        env: &crate::msg::Envelope,
    ) -> Result<(), TransportError> {
        let topo = self
            .topology_now()
            .expect("sending before the topology is installed");
        let t = self
            .transport
            .get()
            .ok_or(TransportError::NoEndpoint(node))?;
        t.send_with(
            node,
            Tag::new(topo.my_node(), topo.epoch(), kind::ENVELOPE),
            crate::msg::frame_len(dest_pe, env),
            &mut |w| crate::msg::write_frame(dest_pe, env, w),
        )?;
        *self
            .frames
            .lock()
            .expect("frame counts poisoned")
            .sent
            .entry(node)
            .or_insert(0) += 1;
        Ok(())
    }

    /// Makes every PE leave its loop; the node then exits with [`EXIT_ABORTED`].
    pub(crate) fn abort(&self, reason: String) {
        if self.finished.load(Ordering::SeqCst) {
            return;
        }
        let mut r = self.abort_reason.lock().expect("abort lock poisoned");
        if r.is_none() {
            error!("{reason}");
            *r = Some(reason);
        }
        self.aborting.store(true, Ordering::SeqCst);
        self.wake_pes();
    }

    /// Interrupts every PE's sleep, so that each sees the abort flag (set
    /// before; the fence pairs with the one in `Inbox::sleep`).
    fn wake_pes(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        for inbox in &self.inboxes {
            inbox.interrupt();
        }
    }

    /// Wake-ups senders paid to this node's PEs, and times they slept.
    pub(crate) fn pe_sleep_counts(&self) -> (u64, u64) {
        self.inboxes
            .iter()
            .fold((0, 0), |(w, s), i| (w + i.wakeups(), s + i.sleeps()))
    }

    /// Ends the job because the member `peer_uid` is gone (its connection
    /// ended, or a send to it failed). Every survivor ends its part of the
    /// job, but only one says so as an error, naming the node: the
    /// lowest-numbered survivor; the others log it at info level, so a lost
    /// node is one line on the job's terminal, not one per node and PE.
    pub(crate) fn lose_peer(&self, peer_uid: u64, reason: &str) {
        // A PE blocked sending to it (a hung peer reads nothing) could not
        // see the job end otherwise.
        if let Some(transport) = self.transport_if_any() {
            transport.disconnect(peer_uid);
        }
        let view = self.view();
        let me = self.topology_now().map(|t| t.my_uid());
        let (reason, speaks) = loss_report(view.as_ref(), peer_uid, me, reason);
        if speaks {
            self.abort(reason);
        } else {
            if !self.finished.load(Ordering::SeqCst) {
                let mut r = self.abort_reason.lock().expect("abort lock poisoned");
                if r.is_none() {
                    info!("{reason}");
                    *r = Some(reason);
                }
            }
            self.aborting.store(true, Ordering::SeqCst);
            self.wake_pes();
        }
    }

    /// Member `peer_uid` was lost (`reason`: how it was noticed). With
    /// `+ft-every`, the node's rescale driver hears of it as of a loss the
    /// coordinator reported, and recovers when it can (or ends the job, as
    /// below); otherwise the job ends here (`lose_peer`).
    pub(crate) fn peer_lost(&self, peer_uid: u64, reason: &str) {
        let member = self.view().and_then(|v| v.by_uid(peer_uid).map(|m| (v.epoch, m.node)));
        match member {
            Some((epoch, node)) if self.options.ft_every > 0 => {
                debug!(node, uid = peer_uid, "member lost: {reason}");
                let lost = ServerMsg::MemberLost {
                    epoch,
                    node,
                    uid: peer_uid,
                };
                let _ = self.events.send(NodeEvent::Coordinator(lost));
            }
            _ => self.lose_peer(peer_uid, reason),
        }
    }

    /// The driver began recovering from the loss of `node` (uid `uid`).
    pub(crate) fn note_loss(&self, node: u32, uid: u64) {
        *self.loss.lock().expect("loss lock poisoned") =
            Some((node, uid, std::time::Instant::now()));
    }

    /// The loss being recovered from, once (PE 0 reports it).
    pub(crate) fn take_loss(&self) -> Option<(u32, u64, std::time::Instant)> {
        self.loss.lock().expect("loss lock poisoned").take()
    }

    pub(crate) fn aborting(&self) -> bool {
        self.aborting.load(Ordering::Relaxed)
    }
}

/// The line that says member `peer_uid` was lost (`reason`: how it was
/// noticed), and whether this node (uid `me`) is the one to say it as an
/// error: the lowest-numbered member of `view` other than the lost one.
fn loss_report(
    view: Option<&View>,
    peer_uid: u64,
    me: Option<u64>,
    reason: &str,
) -> (String, bool) {
    let peer = view.and_then(|v| v.by_uid(peer_uid)).map(|m| m.node);
    let speaker = view.and_then(|v| {
        v.members
            .iter()
            .filter(|m| m.uid != peer_uid)
            .min_by_key(|m| m.node)
            .map(|m| m.uid)
    });
    let line = match peer {
        Some(node) => format!("lost node {node} (uid {peer_uid}): {reason}; ending the job"),
        None => format!("lost the node with uid {peer_uid}: {reason}; ending the job"),
    };
    (line, speaker.is_some() && speaker == me)
}

/// Delivers frames from the transport to the right PE's inbox.
pub(super) struct NodeSink(pub(super) Weak<NodeShared>);

impl Sink for NodeSink {
    fn deliver(&self, tag: Tag, frame: Vec<u8>) {
        let Some(node) = self.0.upgrade() else { return };
        if tag.kind() == kind::CONTROL {
            match postcard::from_bytes::<ControlFrame>(&frame) {
                Ok(frame) => {
                    let _ = node.events.send(NodeEvent::Frame {
                        src: tag.src(),
                        epoch_bits: tag.epoch_bits(),
                        frame,
                    });
                }
                Err(e) => error!(
                    "dropping a malformed control frame from node {}: {e}",
                    tag.src()
                ),
            }
            return;
        }
        let max = node.options.link_delay;
        if !max.is_zero() {
            // +link-delay-us: the transport delivers each link's frames in
            // order, so sleeping here delays frames, not their order (with
            // TCP's one receive thread, every link's).
            std::thread::sleep(max.mul_f64(rand::random::<f64>()));
        }
        let topo = {
            let mut early = node.early.lock().expect("early frames poisoned");
            match node.topology_now() {
                Some(topo) => topo,
                None => return early.push((tag, frame)),
            }
        };
        node.deliver_envelope(&topo, tag, frame);
    }

    fn lost(&self, peer_uid: u64, reason: String) {
        if let Some(node) = self.0.upgrade() {
            let member = node.view().is_some_and(|v| v.by_uid(peer_uid).is_some());
            if !member {
                // A newcomer that dialled speculatively and died before it
                // was admitted, or a node already removed: not the job's loss.
                info!("the connection from uid {peer_uid}, not a member, ended: {reason}");
                return;
            }
            node.peer_lost(peer_uid, &format!("its connection ended ({reason})"));
        }
    }
}

#[cfg(test)]
mod tests {
    use ductile_coordinator::proto::Member;

    use super::*;

    #[test]
    fn a_lost_member_is_said_as_an_error_by_one_survivor_only() {
        let view = View {
            epoch: 3,
            members: (0..4)
                .map(|i| Member {
                    node: i,
                    uid: 50 + u64::from(i),
                    address: vec![],
                    pes: 1,
                    host: "t".into(),
                    pid: i,
                })
                .collect(),
        };
        let speakers: Vec<u64> = (50..54)
            .filter(|&me| me != 52)
            .filter(|&me| loss_report(Some(&view), 52, Some(me), "gone").1)
            .collect();
        assert_eq!(speakers, vec![50], "node 0 speaks for the job");
        let (line, _) = loss_report(
            Some(&view),
            52,
            Some(51),
            "the coordinator reported it gone",
        );
        assert_eq!(
            line,
            "lost node 2 (uid 52): the coordinator reported it gone; ending the job"
        );
        // Node 0 lost: node 1 speaks.
        assert!(loss_report(Some(&view), 50, Some(51), "x").1);
        assert!(!loss_report(Some(&view), 50, Some(52), "x").1);
        // Not in the view (a newcomer admitted later): named by uid.
        let (line, _) = loss_report(Some(&view), 99, Some(50), "x");
        assert!(line.starts_with("lost the node with uid 99: x"), "{line}");
        assert!(
            !loss_report(None, 52, Some(50), "x").1,
            "no view, no speaker"
        );
    }
}
