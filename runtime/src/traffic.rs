//! The transport's traffic as Prometheus series (docs/metrics.md): frames
//! and bytes each transport sent and received, counted on the hot path
//! without a lock or a shared cache line (relaxed atomics spread over cache
//! lines, one per thread slot, that a scrape sums).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use ductile_coordinator::metrics::prometheus::core::{Collector, Desc};
use ductile_coordinator::metrics::prometheus::proto::MetricFamily;
use ductile_coordinator::metrics::prometheus::IntCounterVec;
use ductile_coordinator::metrics::{self as exposition};
use ductile_coordinator::proto::{NodeId, View};

use crate::activity::counter;
use crate::transport::{Reconciled, Sink, Tag, Transport, TransportError};

/// Thread slots of a striped counter: more than PEs per node usually are;
/// threads beyond share slots, which costs only contention.
const STRIPES: usize = 16;

#[repr(align(128))]
#[derive(Default)]
struct Slot(AtomicU64);

/// A counter that threads add to without sharing a cache line.
#[derive(Default)]
pub(crate) struct Striped([Slot; STRIPES]);

impl Striped {
    /// Adds `n` (relaxed: it orders nothing).
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0[stripe()].0.fetch_add(n, Ordering::Relaxed);
    }

    /// The total so far.
    pub(crate) fn sum(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

/// Frames and bytes one transport sent and received.
#[derive(Default)]
pub(crate) struct Traffic {
    sent_frames: Striped,
    sent_bytes: Striped,
    received_frames: Striped,
    received_bytes: Striped,
}

/// Transports a node may run, each with its counters.
const TRANSPORTS: [&str; 2] = ["tcp", "ucx"];

/// The traffic of each transport, and the collector that exports it.
pub(crate) struct TrafficCollector {
    traffic: [Traffic; TRANSPORTS.len()],
    pub(crate) frames: IntCounterVec,
    pub(crate) bytes: IntCounterVec,
    descs: Vec<Desc>,
}

pub(crate) static TRAFFIC: LazyLock<Arc<TrafficCollector>> = LazyLock::new(|| {
    let frames = counter(
        "ductile_transport_messages_total",
        "Frames this node's transport sent to or received from other nodes, by transport and direction (sent, received).",
        &["transport", "direction"],
    );
    let bytes = counter(
        "ductile_transport_bytes_total",
        "Bytes of the frames this node's transport sent or received, by transport and direction.",
        &["transport", "direction"],
    );
    let descs = frames
        .desc()
        .into_iter()
        .chain(bytes.desc())
        .cloned()
        .collect();
    let c = Arc::new(TrafficCollector {
        traffic: Default::default(),
        frames,
        bytes,
        descs,
    });
    exposition::register(exposition::registry(), Box::new(Shared(c.clone())));
    c
});

/// A collector shared between the registry and the code that feeds it.
struct Shared<C>(Arc<C>);

impl<C: Collector> Collector for Shared<C> {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }
    fn collect(&self) -> Vec<MetricFamily> {
        self.0.collect()
    }
}

impl Collector for TrafficCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        // Fresh families each time, holding the sums: a counter cannot be set.
        let frames = self.frames.clone();
        frames.reset();
        let bytes = self.bytes.clone();
        bytes.reset();
        for (name, t) in TRANSPORTS.iter().zip(&self.traffic) {
            let (sent_frames, received_frames) = (t.sent_frames.sum(), t.received_frames.sum());
            if sent_frames + received_frames == 0 {
                continue;
            }
            frames
                .with_label_values(&[name, "sent"])
                .inc_by(sent_frames);
            frames
                .with_label_values(&[name, "received"])
                .inc_by(received_frames);
            bytes
                .with_label_values(&[name, "sent"])
                .inc_by(t.sent_bytes.sum());
            bytes
                .with_label_values(&[name, "received"])
                .inc_by(t.received_bytes.sum());
        }
        frames
            .collect()
            .into_iter()
            .chain(bytes.collect())
            .collect()
    }
}

fn traffic_of(transport: &str) -> &'static Traffic {
    let i = TRANSPORTS.iter().position(|t| *t == transport).unwrap_or(0);
    &LazyLock::force(&TRAFFIC).traffic[i]
}

/// A transport whose frames are counted (`ductile_transport_*`).
pub(crate) struct CountedTransport {
    inner: Arc<dyn Transport>,
    traffic: &'static Traffic,
}

/// `transport` (named `name`: `tcp`, `ucx`) with its sent frames counted.
pub(crate) fn counted(name: &str, transport: Arc<dyn Transport>) -> Arc<dyn Transport> {
    Arc::new(CountedTransport {
        inner: transport,
        traffic: traffic_of(name),
    })
}

impl Transport for CountedTransport {
    fn address(&self) -> Vec<u8> {
        self.inner.address()
    }
    fn send(&self, to: NodeId, tag: Tag, parts: &[&[u8]]) -> Result<(), TransportError> {
        self.traffic.sent_frames.add(1);
        self.traffic
            .sent_bytes
            .add(parts.iter().map(|p| p.len() as u64).sum());
        self.inner.send(to, tag, parts)
    }
    fn send_frame(&self, to: NodeId, tag: Tag, frame: Vec<u8>) -> Result<(), TransportError> {
        self.traffic.sent_frames.add(1);
        self.traffic.sent_bytes.add(frame.len() as u64);
        self.inner.send_frame(to, tag, frame)
    }
    fn send_with(
        &self,
        to: NodeId,
        tag: Tag,
        len: usize,
        fill: &mut dyn FnMut(&mut crate::transport::FrameWrite<'_>) -> std::io::Result<()>,
    ) -> Result<(), TransportError> {
        self.traffic.sent_frames.add(1);
        self.traffic.sent_bytes.add(len as u64);
        self.inner.send_with(to, tag, len, fill)
    }
    fn reconcile(&self, view: &View, me: NodeId) -> Result<Reconciled, TransportError> {
        self.inner.reconcile(view, me)
    }
    fn disconnect(&self, peer_uid: u64) {
        self.inner.disconnect(peer_uid)
    }
    fn shutdown(&self) {
        self.inner.shutdown()
    }
    fn poll(&self) -> bool {
        self.inner.poll()
    }
    fn progress_after(&self) -> std::time::Duration {
        self.inner.progress_after()
    }
    fn pe_spinning(&self, spinning: bool) {
        self.inner.pe_spinning(spinning)
    }
    fn pe_sleeps(&self) -> bool {
        self.inner.pe_sleeps()
    }
    fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.wait_fd()
    }
    fn wait_limit(&self) -> Option<std::time::Duration> {
        self.inner.wait_limit()
    }
}

/// A sink whose received frames are counted.
pub(crate) struct CountedSink<S> {
    inner: S,
    traffic: &'static Traffic,
}

impl<S: Sink> CountedSink<S> {
    /// `sink` of the transport named `name`, counted.
    pub(crate) fn new(name: &str, sink: S) -> Self {
        CountedSink {
            inner: sink,
            traffic: traffic_of(name),
        }
    }
}

impl<S: Sink> Sink for CountedSink<S> {
    fn deliver(&self, tag: Tag, frame: Vec<u8>) {
        self.traffic.received_frames.add(1);
        self.traffic.received_bytes.add(frame.len() as u64);
        self.inner.deliver(tag, frame)
    }
    fn lost(&self, peer_uid: u64, reason: String) {
        self.inner.lost(peer_uid, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::tests::{has_lines, page};

    #[test]
    fn striped_counters_sum_what_every_thread_added() {
        let c = Arc::new(Striped::default());
        let threads: Vec<_> = (0..40)
            .map(|i| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.add(i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.sum(), 1000 * (0..40).sum::<u64>());
    }

    /// The counting wrapper is what a node holds: a hook it did not pass on
    /// would silently fall back to the trait's default (as `disconnect` and
    /// `pe_spinning` once did: the cut of a hung peer and the PE's own
    /// progress never reached TCP).
    #[test]
    fn the_counted_transport_passes_every_call_on() {
        #[derive(Default)]
        struct Calls(std::sync::Mutex<Vec<String>>);
        impl Calls {
            fn note(&self, call: &str) {
                self.0.lock().unwrap().push(call.to_owned());
            }
        }
        impl Transport for Calls {
            fn address(&self) -> Vec<u8> {
                self.note("address");
                Vec::new()
            }
            fn send(&self, _: NodeId, _: Tag, _: &[&[u8]]) -> Result<(), TransportError> {
                self.note("send");
                Ok(())
            }
            fn send_frame(&self, _: NodeId, _: Tag, _: Vec<u8>) -> Result<(), TransportError> {
                self.note("send_frame");
                Ok(())
            }
            fn send_with(
                &self,
                _: NodeId,
                _: Tag,
                _: usize,
                _: &mut dyn FnMut(&mut crate::transport::FrameWrite<'_>) -> std::io::Result<()>,
            ) -> Result<(), TransportError> {
                self.note("send_with");
                Ok(())
            }
            fn reconcile(&self, _: &View, _: NodeId) -> Result<Reconciled, TransportError> {
                self.note("reconcile");
                Ok(Reconciled::default())
            }
            fn disconnect(&self, uid: u64) {
                self.note(&format!("disconnect {uid}"));
            }
            fn shutdown(&self) {
                self.note("shutdown");
            }
            fn poll(&self) -> bool {
                self.note("poll");
                true
            }
            fn progress_after(&self) -> std::time::Duration {
                self.note("progress_after");
                std::time::Duration::from_micros(3)
            }
            fn pe_spinning(&self, spinning: bool) {
                self.note(&format!("pe_spinning {spinning}"));
            }
            fn pe_sleeps(&self) -> bool {
                self.note("pe_sleeps");
                false
            }
            fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
                self.note("wait_fd");
                None
            }
            fn wait_limit(&self) -> Option<std::time::Duration> {
                self.note("wait_limit");
                Some(std::time::Duration::from_millis(2))
            }
        }
        let inner = Arc::new(Calls::default());
        let t = counted("tcp", inner.clone());
        let tag = Tag::new(0, 1, 1);
        t.address();
        t.send(1, tag, &[b"a"]).unwrap();
        t.send_frame(1, tag, vec![1]).unwrap();
        t.send_with(1, tag, 1, &mut |w| w(&[b"a"])).unwrap();
        let view = View {
            epoch: 1,
            members: Vec::new(),
        };
        t.reconcile(&view, 0).unwrap();
        t.disconnect(7);
        assert!(t.poll());
        assert_eq!(t.progress_after(), std::time::Duration::from_micros(3));
        t.pe_spinning(true);
        assert!(!t.pe_sleeps());
        assert!(t.wait_fd().is_none());
        assert_eq!(t.wait_limit(), Some(std::time::Duration::from_millis(2)));
        t.pe_spinning(false);
        t.shutdown();
        assert_eq!(
            *inner.0.lock().unwrap(),
            [
                "address",
                "send",
                "send_frame",
                "send_with",
                "reconcile",
                "disconnect 7",
                "poll",
                "progress_after",
                "pe_spinning true",
                "pe_sleeps",
                "wait_fd",
                "wait_limit",
                "pe_spinning false",
                "shutdown"
            ]
        );
    }

    #[test]
    fn traffic_is_counted_by_transport_and_direction() {
        struct Null;
        impl Transport for Null {
            fn address(&self) -> Vec<u8> {
                Vec::new()
            }
            fn send(&self, _: NodeId, _: Tag, _: &[&[u8]]) -> Result<(), TransportError> {
                Ok(())
            }
            fn reconcile(&self, _: &View, _: NodeId) -> Result<Reconciled, TransportError> {
                Ok(Reconciled::default())
            }
            fn shutdown(&self) {}
        }
        impl Sink for Null {
            fn deliver(&self, _: Tag, _: Vec<u8>) {}
            fn lost(&self, _: u64, _: String) {}
        }
        // The only test of this binary that counts "ucx" traffic: the
        // counters are process-wide, as they are in a node.
        let t = counted("ucx", Arc::new(Null));
        let tag = Tag::new(0, 1, 1);
        t.send(1, tag, &[b"abc", b"de"]).unwrap();
        t.send_frame(1, tag, vec![0; 10]).unwrap();
        CountedSink::new("ucx", Null).deliver(tag, vec![0; 7]);
        has_lines(
            &page(exposition::registry()),
            &[
                "ductile_transport_messages_total{direction=\"sent\",transport=\"ucx\"} 2",
                "ductile_transport_bytes_total{direction=\"sent\",transport=\"ucx\"} 15",
                "ductile_transport_messages_total{direction=\"received\",transport=\"ucx\"} 1",
                "ductile_transport_bytes_total{direction=\"received\",transport=\"ucx\"} 7",
            ],
        );
    }
}
