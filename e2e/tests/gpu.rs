//! `jacobi2d --gpu` seen from outside, on whatever machine runs the tests.
//!
//! Without a GPU (CI, and the machines this was written on) a GPU program
//! must fail at start, with a message naming what is missing and a
//! non-zero exit, and nothing may panic — alone and as a `ductile run` job.
//! Where a driver and a device exist, the same command must instead print
//! the CPU run's checksum. The GPU-only checks (rescales, timings) are in
//! `e2e/gpu/run.sh`.

use std::process::{Command, Stdio};

use ductile_e2e::{bin, last_value, run};

const ARGS: &[&str] = &[
    "--grid",
    "96x80",
    "--block",
    "32x24",
    "--iters",
    "30",
    "--residual-every",
    "10",
];

/// The messages a GPU program may fail with at start on a machine without a GPU.
fn says_no_gpu(stderr: &str) -> bool {
    stderr.contains("no CUDA driver: libcuda.so") || stderr.contains("no CUDA device")
}

fn cpu_checksum() -> String {
    let out = Command::new(bin("jacobi2d"))
        .args(ARGS)
        .env("DUCTILE_PES", "2")
        .output()
        .expect("jacobi2d runs");
    assert!(out.status.success(), "{out:?}");
    last_value(&String::from_utf8_lossy(&out.stdout), "checksum").expect("a checksum")
}

#[test]
fn jacobi2d_gpu_alone_fails_at_start_without_a_gpu_or_matches_the_cpu() {
    let out = Command::new(bin("jacobi2d"))
        .arg("--gpu")
        .args(ARGS)
        .env("DUCTILE_PES", "2")
        .stdin(Stdio::null())
        .output()
        .expect("jacobi2d runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if says_no_gpu(&stderr) {
        assert_eq!(out.status.code(), Some(2), "exit code at start: {stderr}");
        assert!(stderr.starts_with("ductile node: "), "{stderr}");
        assert!(stdout.is_empty(), "nothing ran: {stdout}");
    } else {
        assert!(out.status.success(), "{stderr}");
        assert_eq!(last_value(&stdout, "checksum"), Some(cpu_checksum()));
        assert!(stdout.contains("device=gpu"), "{stdout}");
    }
}

#[test]
fn a_gpu_job_fails_at_start_on_every_node_without_a_gpu_or_matches_the_cpu() {
    let mut args = vec!["--gpu"];
    args.extend_from_slice(ARGS);
    let job = run(2, 2, "jacobi2d", &args);
    assert!(!job.stderr.contains("panicked"), "{}", job.stderr);
    if says_no_gpu(&job.stderr) {
        assert_ne!(job.code, Some(0), "{}", job.stderr);
        assert!(job.stdout.is_empty() || !job.stdout.contains("checksum="));
        let record = job.record();
        assert_eq!(record["outcome"]["result"], "failed", "{record}");
    } else {
        assert_eq!(job.code, Some(0), "{}", job.stderr);
        assert_eq!(job.value("checksum"), Some(cpu_checksum()));
    }
}
