//! Prometheus metrics for every Ductile process: the process's one
//! registry, its text exposition, and the small HTTP server that serves it
//! (each node's `DUCTILE_METRICS` port, the operator's metrics port).
//!
//! The series are kept by the `prometheus` crate (re-exported here, so the
//! runtime and the operator use one version of it and other crates can add
//! their own to [`registry`]); the HTTP is hyper's, the maintained stack the
//! dependency tree already carries through kube. What this module adds is
//! the bound on what a scraper, or anyone else who reaches the port, can
//! hold: a cap on open connections where a newcomer displaces an idle one,
//! a deadline for each request head (slow clients and idle keep-alive
//! connections are closed), a cap on a connection's lifetime and on the size
//! of a request head. docs/metrics.md says why this crate and these limits.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use std::io::Write as _;

use hyper::header::{
    HeaderValue, ACCEPT_ENCODING, ALLOW, CONNECTION, CONTENT_ENCODING,
    CONTENT_TYPE as CONTENT_TYPE_HEADER, VARY,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Notify;
use tracing::{debug, error};

pub use hyper::StatusCode;
pub use prometheus;

/// `Content-Type` of a scrape's reply: the text format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// This process's registry: every series a Ductile process exports is in
/// it, and any crate linked into the process may register more.
pub fn registry() -> &'static prometheus::Registry {
    static REGISTRY: LazyLock<prometheus::Registry> = LazyLock::new(prometheus::Registry::new);
    &REGISTRY
}

/// Registers `collector` in `registry`; a second registration of the same
/// series (a bug) is logged rather than fatal, since metrics never stop a
/// job.
pub fn register(registry: &prometheus::Registry, collector: Box<dyn prometheus::core::Collector>) {
    if let Err(e) = registry.register(collector) {
        error!("a metric could not be registered: {e}");
    }
}

/// `registry`'s series in the text format 0.0.4.
pub fn render(registry: &prometheus::Registry) -> String {
    let mut page = String::new();
    if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut page) {
        // Inconsistent families are a bug; serve what was written.
        error!("writing the metrics page failed: {e}");
    }
    page
}

/// The sample names `families` expose: a histogram's `_bucket`, `_sum`
/// and `_count`, a counter's or a gauge's own name (what a query can name).
pub fn series_names(families: &[prometheus::proto::MetricFamily]) -> Vec<String> {
    use prometheus::proto::MetricType;
    let mut names = Vec::new();
    for f in families {
        let name = f.name();
        match f.get_field_type() {
            MetricType::HISTOGRAM | MetricType::SUMMARY => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.push(format!("{name}{suffix}"));
                }
            }
            _ => names.push(name.to_owned()),
        }
    }
    names.sort();
    names.dedup();
    names
}

/// One reply of the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// The HTTP status.
    pub status: StatusCode,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its body.
    pub body: String,
}

impl Page {
    /// `registry`'s series, as a scrape expects them.
    pub fn metrics(registry: &prometheus::Registry) -> Page {
        Page {
            status: StatusCode::OK,
            content_type: CONTENT_TYPE,
            body: render(registry),
        }
    }

    /// A plain-text reply.
    pub fn text(status: StatusCode, body: impl Into<String>) -> Page {
        Page {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }
}

/// What the server answers to `GET path` (the query string dropped); `None`
/// is 404. Called on the server's thread: keep it short.
pub type Routes = Arc<dyn Fn(&str) -> Option<Page> + Send + Sync>;

/// Routes that serve `registry` on `/metrics` and nothing else.
pub fn metrics_only(registry: &'static prometheus::Registry) -> Routes {
    Arc::new(move |path| (path == "/metrics").then(|| Page::metrics(registry)))
}

/// The bounds on what clients can hold of the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once. At the cap, a new connection displaces the
    /// oldest one that never sent a whole request (failing that, the
    /// oldest), so a flood of idle connections cannot lock a scraper out.
    pub max_connections: usize,
    /// Time a client has to send a whole request head, from when the
    /// connection opens or its previous reply went out; then it is closed.
    pub header_timeout: Duration,
    /// Time a connection may stay open, however busy.
    pub max_lifetime: Duration,
    /// Largest request head read (at least 8 KiB); a larger one gets 431.
    pub max_head_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            header_timeout: Duration::from_secs(5),
            max_lifetime: Duration::from_secs(120),
            max_head_bytes: 16 * 1024,
        }
    }
}

/// One open connection, as the cap sees it.
struct Open {
    /// It sent at least one whole request.
    served: AtomicBool,
    /// Closes it.
    evict: Notify,
}

/// The open connections by arrival order.
#[derive(Default)]
struct Connections {
    next: u64,
    open: BTreeMap<u64, Arc<Open>>,
}

impl Connections {
    /// Makes room under `cap` and admits a connection; its id.
    fn admit(&mut self, conn: Arc<Open>, cap: usize) -> u64 {
        while self.open.len() >= cap.max(1) {
            let victim = self
                .open
                .iter()
                .find(|(_, c)| !c.served.load(Ordering::Relaxed))
                .or_else(|| self.open.iter().next())
                .map(|(&id, _)| id);
            let Some(id) = victim else { break };
            if let Some(c) = self.open.remove(&id) {
                // A permit is stored if its task has not reached its wait yet.
                c.evict.notify_one();
            }
        }
        let id = self.next;
        self.next += 1;
        self.open.insert(id, conn);
        id
    }
}

fn lock(conns: &Mutex<Connections>) -> std::sync::MutexGuard<'_, Connections> {
    // The map stays consistent whatever panicked while holding it.
    conns.lock().unwrap_or_else(|p| p.into_inner())
}

/// The reply to one request: `GET` and `HEAD` through `routes`, anything
/// else 405. Error replies close the connection.
fn answer(routes: &Routes, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let page = match *req.method() {
        Method::GET | Method::HEAD => routes(req.uri().path())
            .unwrap_or_else(|| Page::text(StatusCode::NOT_FOUND, "not found\n")),
        _ => Page::text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n"),
    };
    let gzipped = (page.status.is_success() && page.body.len() >= GZIP_FROM && accepts_gzip(req))
        .then(|| gzip(page.body.as_bytes()))
        .flatten();
    let body = match &gzipped {
        Some(zipped) => Bytes::from(zipped.clone()),
        None => Bytes::from(page.body),
    };
    let mut reply = Response::new(Full::new(body));
    *reply.status_mut() = page.status;
    let headers = reply.headers_mut();
    headers.insert(
        CONTENT_TYPE_HEADER,
        HeaderValue::from_static(page.content_type),
    );
    headers.insert(VARY, HeaderValue::from_static("accept-encoding"));
    if gzipped.is_some() {
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if page.status == StatusCode::METHOD_NOT_ALLOWED {
        headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    if !page.status.is_success() {
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    reply
}

/// Pages shorter than this go uncompressed (gzip's header and the CPU
/// would cost more than they save).
const GZIP_FROM: usize = 1024;

/// Whether the request's `Accept-Encoding` lists `gzip` (or `x-gzip`, or
/// `*`) without `q=0`, as Prometheus's scrapes do.
fn accepts_gzip(req: &Request<Incoming>) -> bool {
    req.headers()
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or("").to_ascii_lowercase();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            matches!(name.as_str(), "gzip" | "x-gzip" | "*") && !refused
        })
}

/// `body` compressed with gzip; `None` if compressing failed (the page is
/// then served as it is).
fn gzip(body: &[u8]) -> Option<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    encoder.write_all(body).ok()?;
    encoder.finish().ok()
}

/// Serves `routes` on `listener` within `limits` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, limits: Limits, routes: Routes) {
    let conns = Arc::new(Mutex::new(Connections::default()));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, most likely: let connections close.
                debug!("metrics: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let open = Arc::new(Open {
            served: AtomicBool::new(false),
            evict: Notify::new(),
        });
        let id = lock(&conns).admit(open.clone(), limits.max_connections);
        let (conns, routes) = (conns.clone(), routes.clone());
        tokio::spawn(async move {
            let marked = open.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                marked.served.store(true, Ordering::Relaxed);
                let reply = answer(&routes, &req);
                async move { Ok::<_, Infallible>(reply) }
            });
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(limits.max_head_bytes.max(8192));
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                ended = tokio::time::timeout(limits.max_lifetime, connection) => match ended {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => debug!(%peer, "metrics connection: {e}"),
                    Err(_) => debug!(%peer, "metrics connection closed: open too long"),
                },
                _ = open.evict.notified() => debug!(%peer, "metrics connection displaced by a newer one"),
            }
            lock(&conns).open.remove(&id);
        });
    }
}

/// Serves `routes` on `listener` within `limits` from a thread of its own
/// (with a one-thread tokio runtime), for processes whose work is not on
/// tokio; returns the bound address.
pub fn serve_in_thread(
    listener: std::net::TcpListener,
    limits: Limits,
    routes: Routes,
) -> std::io::Result<SocketAddr> {
    let bound = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("ductile-metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => serve(listener, limits, routes).await,
                    Err(e) => error!("metrics: cannot serve on {bound}: {e}"),
                }
            })
        })?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};
    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn exchange(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        reply
    }

    fn server(limits: Limits) -> (SocketAddr, &'static prometheus::Registry) {
        let registry: &'static prometheus::Registry = Box::leak(Box::default());
        let c = IntCounterVec::new(Opts::new("t_total", "Things."), &["kind"]).unwrap();
        register(registry, Box::new(c.clone()));
        c.with_label_values(&["a\"b"]).inc_by(3);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = serve_in_thread(listener, limits, metrics_only(registry)).unwrap();
        (addr, registry)
    }

    #[test]
    fn a_page_has_escaped_labels_and_cumulative_millisecond_buckets() {
        let registry = prometheus::Registry::new();
        let h = HistogramVec::new(
            HistogramOpts::new("h_seconds", "Times.\nMore.").buckets(vec![0.001, 0.01, 0.1]),
            &["stage"],
        )
        .unwrap();
        register(&registry, Box::new(h.clone()));
        // Nothing observed, no child: the family is left out.
        assert_eq!(render(&registry), "");
        for v in [0.0005, 0.005, 0.007, 3.0] {
            h.with_label_values(&["stop"]).observe(v);
        }
        let text = render(&registry);
        for line in [
            "# HELP h_seconds Times.\\nMore.",
            "# TYPE h_seconds histogram",
            "h_seconds_bucket{stage=\"stop\",le=\"0.001\"} 1",
            "h_seconds_bucket{stage=\"stop\",le=\"0.01\"} 3",
            "h_seconds_bucket{stage=\"stop\",le=\"0.1\"} 3",
            "h_seconds_bucket{stage=\"stop\",le=\"+Inf\"} 4",
            "h_seconds_count{stage=\"stop\"} 4",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn the_server_answers_scrapes_heads_and_refusals() {
        let (addr, _) = server(Limits::default());
        let r = exchange(
            addr,
            "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        );
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("text/plain; version=0.0.4"), "{r}");
        assert!(r.contains("\r\n\r\n# HELP t_total Things.\n"), "{r}");
        assert!(r.contains("t_total{kind=\"a\\\"b\"} 3\n"), "{r}");
        let r = exchange(addr, "HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 200") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        // Refusals close the connection even when the client asked for more.
        let r = exchange(addr, "GET /nope HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
        let r = exchange(addr, "POST /metrics HTTP/1.1\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 405") && r.contains("allow: GET, HEAD"),
            "{r}"
        );
        let r = exchange(addr, "\x16\x03\x01 hello\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(40_000));
        let r = exchange(addr, &huge);
        assert!(r.starts_with("HTTP/1.1 431"), "{r}");
        // Keep-alive: two scrapes over one connection.
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for _ in 0..2 {
            s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        }
    }

    #[test]
    fn a_scrape_that_accepts_gzip_gets_the_page_compressed_and_others_plain() {
        let (addr, registry) = server(Limits::default());
        // A page long enough to be worth compressing.
        let c = IntCounterVec::new(Opts::new("long_total", "Many series."), &["n"]).unwrap();
        register(registry, Box::new(c.clone()));
        for n in 0..100 {
            c.with_label_values(&[&n.to_string()]).inc();
        }
        let page = render(registry);
        let raw = |accept: &str| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let request = format!(
                "GET /metrics HTTP/1.1\r\nAccept-Encoding: {accept}\r\nConnection: close\r\n\r\n"
            );
            s.write_all(request.as_bytes()).unwrap();
            let mut reply = Vec::new();
            s.read_to_end(&mut reply).unwrap();
            let split = reply.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
            let head = String::from_utf8_lossy(&reply[..split]).to_ascii_lowercase();
            (head, reply[split + 4..].to_vec())
        };
        // Prometheus's own header: gzip, decoded back to the same page.
        let (head, body) = raw("gzip");
        assert!(head.contains("content-encoding: gzip"), "{head}");
        assert!(head.contains("vary: accept-encoding"), "{head}");
        let mut text = String::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, page);
        assert!(
            body.len() < page.len() / 2,
            "{} of {}",
            body.len(),
            page.len()
        );
        // Refused with q=0, or not offered: plain text.
        for accept in ["gzip;q=0, identity", "identity", "br"] {
            let (head, body) = raw(accept);
            assert!(!head.contains("content-encoding"), "{accept}: {head}");
            assert_eq!(String::from_utf8(body).unwrap(), page, "{accept}");
        }
    }

    #[test]
    fn a_connection_that_sends_nothing_is_closed_after_the_head_deadline() {
        let (addr, _) = server(Limits {
            header_timeout: Duration::from_millis(200),
            ..Limits::default()
        });
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 16];
        // Closed without a reply (not the 10 s read timeout).
        assert_eq!(idle.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn a_scrape_is_answered_under_a_flood_of_idle_connections() {
        let limits = Limits {
            max_connections: 16,
            // Long enough that no idle connection times out during the test:
            // only displacement can make room.
            header_timeout: Duration::from_secs(60),
            ..Limits::default()
        };
        let (addr, _) = server(limits);
        // Half a request head: a slowloris client.
        let flood: Vec<TcpStream> = (0..150)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost:").unwrap();
                s
            })
            .collect();
        for _ in 0..3 {
            let r = exchange(addr, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
            assert!(
                r.starts_with("HTTP/1.1 200") && r.contains("t_total"),
                "{r}"
            );
        }
        // At most the cap stayed open: the others were closed by the server.
        let mut closed = 0;
        for mut s in flood {
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            match s.read(&mut [0u8; 16]) {
                Ok(0) => closed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed += 1,
                _ => {}
            }
        }
        assert!(closed >= 150 - 16, "only {closed} idle connections closed");
    }

    #[test]
    fn displacement_prefers_connections_that_never_asked() {
        let mut c = Connections::default();
        let conns: Vec<Arc<Open>> = (0..3)
            .map(|_| {
                Arc::new(Open {
                    served: AtomicBool::new(false),
                    evict: Notify::new(),
                })
            })
            .collect();
        conns[0].served.store(true, Ordering::Relaxed);
        for conn in &conns {
            c.admit(conn.clone(), 2);
        }
        // The first was a scraper: the second, idle, made room.
        assert_eq!(c.open.keys().copied().collect::<Vec<_>>(), vec![0, 2]);
    }
}
