//! A job's Prometheus metrics, scraped by a real Prometheus server while the
//! job is rescaled (`ductile run --metrics-port`, docs/metrics.md).
//!
//! Ignored by a plain `cargo test`: it needs the `prometheus` binary, which
//! `scripts/test` installs (Debian's package) before it runs the tests whose
//! names say prometheus.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ductile_coordinator::control::{ControlClient, ControlError, RescaleRequest};
use ductile_coordinator::Secret;
use ductile_e2e::{bin, eventually};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// A child process killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 exchange over a fresh connection; (status line, body).
fn http(addr: &str, request: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, body.to_owned())
}

fn get(addr: &str, path: &str) -> (String, String) {
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
}

/// `prometheus` on the PATH, or a message saying how to get it.
fn prometheus_binary() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
        .expect("no `prometheus` on PATH: scripts/test installs it (apt-get install prometheus)")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts Prometheus scraping `target` every second; its address.
fn start_prometheus(dir: &Path, target: &str) -> (Killed, String) {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: ductile\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(prometheus_binary())
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting prometheus");
    let prometheus = Killed(child);
    assert!(
        eventually(WAIT, || TcpStream::connect(&addr).is_ok()
            && get(&addr, "/-/ready").0.contains("200")),
        "prometheus never became ready:\n{}",
        std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
    );
    (prometheus, addr)
}

/// An instant query through Prometheus's HTTP API: label set -> value.
fn query(prometheus: &str, promql: &str) -> Vec<(Value, f64)> {
    let encoded: String = promql
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (status, body) = get(prometheus, &format!("/api/v1/query?query={encoded}"));
    assert!(status.contains("200"), "{promql}: {status}\n{body}");
    let reply: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(reply["status"], "success", "{body}");
    reply["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let value = r["value"][1].as_str().unwrap().parse().unwrap();
            (r["metric"].clone(), value)
        })
        .collect()
}

/// The one value of `promql` once it is `want` (Prometheus scrapes every
/// second, so a new value shows within a few seconds).
fn eventually_equals(prometheus: &str, promql: &str, want: f64) {
    let mut last = Vec::new();
    let seen = eventually(WAIT, || {
        last = query(prometheus, promql);
        last.len() == 1 && last[0].1 == want
    });
    assert!(
        seen,
        "{promql}: want {want}, Prometheus has {last:?}; its targets: {}",
        get(prometheus, "/api/v1/targets").1
    );
}

fn ductile(state: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bin("ductile"))
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .output()
        .expect("running ductile")
}

fn stage_ms(report: &Value, stage: &str) -> f64 {
    report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == stage)
        .unwrap_or_else(|| panic!("no {stage} in {report}"))["ms"]
        .as_f64()
        .unwrap()
}

#[test]
#[ignore = "needs the prometheus binary; scripts/test installs it and runs the tests named prometheus"]
fn prometheus_scrapes_node_0_and_sees_each_rescale_with_its_stages_and_gpu_work() {
    let work = tempfile::tempdir().unwrap();
    let state = work.path().join("state");
    // Long enough to outlive the test, which ends it.
    let args = ductile_e2e::jacobi_args(10_000_000);
    let job = Command::new(bin("ductile"))
        .args([
            "run",
            "--nodes",
            "3",
            "--metrics-port",
            "0",
            "--timeout",
            "300",
        ])
        .arg("--state-dir")
        .arg(&state)
        .arg("--")
        .arg(bin("jacobi2d"))
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(work.path().join("job.stderr")).unwrap())
        .spawn()
        .expect("spawning ductile run");
    let mut job = Killed(job);
    assert!(
        eventually(WAIT, || state.join("metrics.addr").exists()
            && state.join("control.addr").exists()),
        "node 0 never published its metrics address"
    );
    let metrics = std::fs::read_to_string(state.join("metrics.addr")).unwrap();

    // The endpoint itself: the job as node 0 sees it, no rescale yet, and
    // clear refusals for what is not a scrape.
    let (status, page) = get(&metrics, "/metrics");
    assert!(status.contains("200"), "{status}");
    for line in [
        "ductile_job_nodes 3",
        "ductile_job_epoch 1",
        "ductile_node_id 0",
        "ductile_node_member 1",
    ] {
        assert!(
            page.lines().any(|l| l == line),
            "missing {line:?} in\n{page}"
        );
    }
    assert!(!page.contains("ductile_rescales_total"), "{page}");
    assert!(
        !page.contains("ductile_gpu_"),
        "a CPU job has no GPU section\n{page}"
    );
    assert!(get(&metrics, "/nope").0.contains("404"));
    assert!(http(&metrics, "POST /metrics HTTP/1.1\r\n\r\n")
        .0
        .contains("405"));
    assert!(http(&metrics, "\x16\x03\x01 hello\r\n\r\n")
        .0
        .contains("400"));

    let (_prometheus, prometheus) = start_prometheus(work.path(), &metrics);
    eventually_equals(&prometheus, "up{job=\"ductile\"}", 1.0);
    eventually_equals(&prometheus, "ductile_job_nodes", 3.0);

    // Two rescales through the CLI.
    let mut reports = Vec::new();
    for op in [["shrink", "--nodes", "1"], ["expand", "--nodes", "1"]] {
        let out = ductile(&state, &[&op[..], &["--json", "--timeout", "120"]].concat());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{op:?}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        reports.push(serde_json::from_str::<Value>(&stdout).unwrap());
    }
    // A request node 0 refuses: a newcomer to admit, and none waits.
    let secret = std::fs::read_to_string(state.join("secret")).unwrap();
    let control = std::fs::read_to_string(state.join("control.addr")).unwrap();
    let mut client =
        ControlClient::connect(&control, &Secret::from_hex(secret.trim()).unwrap(), WAIT).unwrap();
    let epoch = client.status().unwrap().epoch;
    let refused = client
        .rescale(
            RescaleRequest {
                epoch,
                remove: vec![],
                admit: 1,
            },
            Duration::from_secs(30),
        );
    assert!(
        matches!(&refused, Err(ControlError::Refused(m)) if m.contains("none is waiting")),
        "{refused:?}"
    );

    eventually_equals(
        &prometheus,
        "ductile_rescales_total{outcome=\"committed\"}",
        2.0,
    );
    eventually_equals(
        &prometheus,
        "ductile_rescales_total{outcome=\"refused\"}",
        1.0,
    );
    eventually_equals(&prometheus, "ductile_job_epoch", 3.0);
    eventually_equals(&prometheus, "ductile_job_nodes", 3.0);
    eventually_equals(&prometheus, "ductile_rescale_mechanism_seconds_count", 2.0);
    // Every stage of the reports, summed, is what Prometheus holds.
    for stage in ["stop", "commit", "reconcile", "reentry"] {
        let want: f64 = reports.iter().map(|r| stage_ms(r, stage)).sum::<f64>() / 1e3;
        let got = query(
            &prometheus,
            &format!("ductile_rescale_stage_seconds_sum{{stage=\"{stage}\"}}"),
        );
        assert_eq!(got.len(), 1, "{stage}: {got:?}");
        assert!(
            (got[0].1 - want).abs() <= 1e-9 * want.max(1e-3),
            "{stage}: Prometheus {} s, reports {want} s",
            got[0].1
        );
        eventually_equals(
            &prometheus,
            &format!("ductile_rescale_stage_seconds_count{{stage=\"{stage}\"}}"),
            2.0,
        );
    }
    // GPU work has series of its own, zero for a CPU job.
    for work in ["staging", "context"] {
        eventually_equals(
            &prometheus,
            &format!("ductile_rescale_gpu_seconds_count{{work=\"{work}\"}}"),
            2.0,
        );
        eventually_equals(
            &prometheus,
            &format!("ductile_rescale_gpu_seconds_sum{{work=\"{work}\"}}"),
            0.0,
        );
    }
    let migrations: u64 = reports
        .iter()
        .map(|r| r["migrations"].as_u64().unwrap())
        .sum();
    eventually_equals(
        &prometheus,
        "ductile_rescale_migrations_total",
        migrations as f64,
    );

    // Scraping took nothing from the job: it is still running.
    assert!(
        job.0.try_wait().unwrap().is_none(),
        "the job ended early:\n{}",
        std::fs::read_to_string(work.path().join("job.stderr")).unwrap_or_default()
    );
    // Stop it as a user would (SIGTERM: the launcher stops every process and
    // records the outcome). This test used to end with the SIGKILL of the
    // drop, which left the job's coordinator running (issue 22).
    let _ = Command::new("kill")
        .args(["-TERM", &job.0.id().to_string()])
        .status();
    assert!(
        eventually(WAIT, || job.0.try_wait().ok().flatten().is_some()),
        "the job did not stop on SIGTERM"
    );
}

/// Every identifier of `expr` that names a Ductile series (label values in
/// quotes and label names inside braces are not series).
fn series_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let (mut in_quotes, mut depth) = (false, 0);
    let mut chars = expr.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => in_quotes = !in_quotes,
            _ if in_quotes => {}
            '{' => depth += 1,
            '}' => depth -= 1,
            c if depth == 0 && (c.is_ascii_alphabetic() || c == '_') => {
                let mut end = i + c.len_utf8();
                while let Some(&(j, d)) = chars.peek() {
                    if d.is_ascii_alphanumeric() || d == '_' || d == ':' {
                        end = j + d.len_utf8();
                        chars.next();
                    } else {
                        break;
                    }
                }
                let word = &expr[i..end];
                if word.starts_with("ductile_") {
                    names.push(word.to_owned());
                }
            }
            _ => {}
        }
    }
    names
}

fn exprs_of(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    _ => exprs_of(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs_of(v, out)),
        _ => {}
    }
}

/// The Grafana dashboard in the chart names only series the nodes and the
/// operator export (from their collectors, not from a list kept by hand).
#[test]
fn the_dashboard_queries_only_series_the_project_exports() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/ductile/dashboards/ductile.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exported: std::collections::BTreeSet<String> =
        ductile::exported_series().into_iter().collect();
    exported.extend(ductile_operator::k8s::metrics::Metrics::exported_series());
    // The catalogue itself: histograms expand, the families of issue 21 are there.
    for name in [
        "ductile_job_epoch",
        "ductile_rescale_stage_seconds_sum",
        "ductile_rescale_stage_seconds_bucket",
        "ductile_app_iterations_total",
        "ductile_transport_bytes_total",
        "ductile_lb_migrated_bytes_total",
        "ductile_gpu_start_seconds",
        "ductile_operator_notice_to_commit_by_signal_seconds_bucket",
    ] {
        assert!(exported.contains(name), "{name} is not exported: {exported:?}");
    }

    let mut exprs = Vec::new();
    exprs_of(&dashboard, &mut exprs);
    assert!(exprs.len() >= 20, "only {} queries in the dashboard", exprs.len());
    let mut queried = std::collections::BTreeSet::new();
    for expr in &exprs {
        let names = series_in(expr);
        assert!(!names.is_empty(), "a query that names no Ductile series: {expr}");
        queried.extend(names);
    }
    let unknown: Vec<&String> = queried.difference(&exported).collect();
    assert!(unknown.is_empty(), "the dashboard queries series nobody exports: {unknown:?}");
    // Nodes and operator both have panels, and so do the new families.
    for name in [
        "ductile_rescale_mechanism_seconds_bucket",
        "ductile_app_iterations_total",
        "ductile_lb_step_seconds_bucket",
        "ductile_transport_bytes_total",
        "ductile_operator_notice_to_commit_by_signal_seconds_bucket",
    ] {
        assert!(queried.contains(name), "no panel queries {name}");
    }
    // The check can fail: a misspelt series is caught, a label value is not a series.
    assert_eq!(
        series_in("sum by (le) (rate(ductile_rescale_mechanism_second_bucket{job=\"ductile_x\"}[5m]))"),
        vec!["ductile_rescale_mechanism_second_bucket".to_owned()]
    );
    assert!(!exported.contains("ductile_rescale_mechanism_second_bucket"));
}
