//! The Prometheus text exposition format (0.0.4) and the little HTTP it is
//! served over, shared by the operator (`/metrics` of `ductile operator`)
//! and the runtime (each node's `/metrics`, `DUCTILE_METRICS`).
//!
//! Hand-written rather than through the `prometheus` crate: counters,
//! gauges, summaries without quantiles and fixed-bucket histograms are all
//! either side needs, and the format is a few lines of text.

use std::collections::BTreeMap;
use std::fmt::{Display, Write as _};

/// `Content-Type` of a scrape's reply.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Largest request head a server reads before it gives up on the request.
pub const MAX_REQUEST_HEAD: usize = 16 * 1024;

/// A metrics page being written: families in the order they are declared.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// An empty page.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares a family: its `# HELP` and `# TYPE` lines (`kind` is
    /// `counter`, `gauge`, `summary` or `histogram`).
    pub fn family(&mut self, name: &str, help: &str, kind: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {}", help.replace('\n', " "));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        self
    }

    /// One sample line: `name{labels} value`.
    pub fn sample(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        value: impl Display,
    ) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (label, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{label}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, help: &str, kind: &str, value: impl Display) -> &mut Self {
        self.family(name, help, kind).sample(name, &[], value)
    }

    /// A counter family with one sample per value of `label`.
    pub fn counters_by(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        values: &BTreeMap<String, u64>,
    ) -> &mut Self {
        self.family(name, help, "counter");
        for (value, count) in values {
            self.sample(name, &[(label, value)], count);
        }
        self
    }

    /// A summary family (sum and count, no quantiles) with one series per
    /// value of `label`.
    pub fn summaries_by(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        values: &BTreeMap<String, Summary>,
    ) -> &mut Self {
        self.family(name, help, "summary");
        for (value, s) in values {
            self.sample(&format!("{name}_sum"), &[(label, value)], s.sum);
            self.sample(&format!("{name}_count"), &[(label, value)], s.count);
        }
        self
    }

    /// A histogram family.
    pub fn histogram(&mut self, name: &str, help: &str, h: &Histogram) -> &mut Self {
        self.family(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        for (bound, count) in h.bounds.iter().zip(&h.counts) {
            self.sample(&bucket, &[("le", &bound.to_string())], count);
        }
        self.sample(&bucket, &[("le", "+Inf")], h.count);
        self.sample(&format!("{name}_sum"), &[], h.sum);
        self.sample(&format!("{name}_count"), &[], h.count)
    }

    /// The page.
    pub fn finish(self) -> String {
        self.out
    }
}

/// A label value as the format quotes it.
pub fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Observations summed and counted.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Summary {
    /// Adds one observation.
    pub fn observe(&mut self, value: f64) {
        self.sum += value;
        self.count += 1;
    }
}

/// A histogram over fixed upper bounds (cumulative counts, as exposed).
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    /// An empty histogram with the buckets' upper bounds, ascending.
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            count: 0,
            sum: 0.0,
        }
    }

    /// Adds one observation.
    pub fn observe(&mut self, value: f64) {
        for (bound, count) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.count += 1;
        self.sum += value;
    }
}

/// What a scrape asked for, from the head of an HTTP request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `GET path` (the query string dropped).
    Get(String),
    /// Another method.
    Other(String),
    /// Not an HTTP request line.
    Malformed,
}

/// Reads the request line of an HTTP request head.
pub fn parse_request(head: &[u8]) -> Request {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let Ok(line) = std::str::from_utf8(line) else {
        return Request::Malformed;
    };
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(method), Some(target), Some(version)) if version.starts_with("HTTP/") => {
            let path = target.split('?').next().unwrap_or_default().to_owned();
            if method == "GET" {
                Request::Get(path)
            } else {
                Request::Other(method.to_owned())
            }
        }
        _ => Request::Malformed,
    }
}

/// Whether `buf` holds a whole request head.
pub fn head_complete(buf: &[u8]) -> bool {
    buf.windows(4).any(|w| w == b"\r\n\r\n")
}

/// A whole HTTP/1.1 reply that closes the connection.
pub fn reply(status: &str, content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_has_declared_families_escaped_labels_and_cumulative_buckets() {
        static BOUNDS: [f64; 3] = [0.5, 1.0, 2.0];
        let mut h = Histogram::new(&BOUNDS);
        for v in [0.1, 0.7, 1.5, 9.0] {
            h.observe(v);
        }
        let mut stages = BTreeMap::new();
        stages
            .entry("stop".to_owned())
            .or_insert_with(Summary::default)
            .observe(0.25);
        stages.get_mut("stop").unwrap().observe(0.5);
        let mut by = BTreeMap::new();
        by.insert("a\"b\\c\nd".to_owned(), 3);
        let mut page = Exposition::new();
        page.single("x_total", "Things.\nMore.", "counter", 7)
            .counters_by("y_total", "By label.", "kind", &by)
            .summaries_by("z_seconds", "Stages.", "stage", &stages)
            .histogram("h_seconds", "Times.", &h);
        let text = page.finish();
        let expected = "\
# HELP x_total Things. More.
# TYPE x_total counter
x_total 7
# HELP y_total By label.
# TYPE y_total counter
y_total{kind=\"a\\\"b\\\\c\\nd\"} 3
# HELP z_seconds Stages.
# TYPE z_seconds summary
z_seconds_sum{stage=\"stop\"} 0.75
z_seconds_count{stage=\"stop\"} 2
# HELP h_seconds Times.
# TYPE h_seconds histogram
h_seconds_bucket{le=\"0.5\"} 1
h_seconds_bucket{le=\"1\"} 2
h_seconds_bucket{le=\"2\"} 3
h_seconds_bucket{le=\"+Inf\"} 4
h_seconds_sum 11.3
h_seconds_count 4
";
        assert_eq!(text, expected);
    }

    #[test]
    fn request_lines_are_read_and_garbage_is_malformed() {
        assert_eq!(
            parse_request(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
            Request::Get("/metrics".into())
        );
        assert_eq!(
            parse_request(b"POST /metrics HTTP/1.0\r\n\r\n"),
            Request::Other("POST".into())
        );
        for bad in [
            &b""[..],
            b"\r\n\r\n",
            b"GET /metrics\r\n\r\n",
            b"\xff\xfe GET / HTTP/1.1\r\n",
            b"GET / SPDY\r\n",
        ] {
            assert_eq!(parse_request(bad), Request::Malformed, "{bad:?}");
        }
        assert!(head_complete(b"GET / HTTP/1.1\r\n\r\n"));
        assert!(!head_complete(b"GET / HTTP/1.1\r\n"));
        let r = reply("200 OK", CONTENT_TYPE, "a 1\n");
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n")
                && r.contains("Content-Length: 4\r\n")
                && r.ends_with("\r\n\r\na 1\n")
        );
    }
}
