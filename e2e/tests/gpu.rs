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

/// The CUDA compile tools of `scripts/install-cuda-tools` (NVRTC, ptxas).
fn cuda_tools() -> std::path::PathBuf {
    let dir = std::env::var_os("DUCTILE_CUDA_TOOLS")
        .expect("DUCTILE_CUDA_TOOLS: where scripts/install-cuda-tools put NVRTC and ptxas");
    std::path::PathBuf::from(dir)
}

#[test]
#[ignore = "needs NVRTC and ptxas: scripts/install-cuda-tools and DUCTILE_CUDA_TOOLS (scripts/test runs it)"]
fn nvrtc_compiles_the_programs_gpu_modules_into_ptx_that_ptxas_assembles() {
    let tools = cuda_tools();
    let dir = tempfile::tempdir().expect("temporary directory");
    for (cc, sm) in [("8.0", "sm_80"), ("9.0", "sm_90")] {
        let out_dir = dir.path().join(sm);
        let out = Command::new(bin("gpu_probe"))
            .args(["--emit-ptx"])
            .arg(&out_dir)
            .args(["--cc", cc])
            .env("LD_LIBRARY_PATH", tools.join("lib"))
            .output()
            .expect("gpu_probe runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "gpu_probe --emit-ptx: {stderr}");
        let ptx_path = out_dir.join("jacobi2d.ptx");
        let ptx = std::fs::read_to_string(&ptx_path).expect("the Jacobi2D module's PTX");
        let header = ptx.lines().next().unwrap_or_default();
        assert!(
            header.starts_with("// ductile gpu module jacobi2d source="),
            "{header}"
        );
        assert!(ptx.contains(&format!(".target {sm}")), "{sm}");
        for k in ["jacobi_sweep", "jacobi_pack", "jacobi_unpack"] {
            assert!(ptx.contains(&format!(".entry {k}(")), "{k} in the PTX");
        }
        // The sweep's four additions, its multiply and the residual's
        // subtraction, each rounded on its own: no fused multiply-add.
        assert!(ptx.matches("add.rn.f64").count() >= 4, "{ptx}");
        assert!(
            ptx.contains("mul.rn.f64") && ptx.contains("sub.rn.f64"),
            "{ptx}"
        );
        assert!(!ptx.contains("fma."), "{ptx}");
        // What a driver's JIT does with it, done by ptxas: PTX valid for the device.
        let cubin = out_dir.join("jacobi2d.cubin");
        let asm = Command::new(tools.join("bin/ptxas"))
            .arg(format!("-arch={sm}"))
            .arg(&ptx_path)
            .arg("-o")
            .arg(&cubin)
            .output()
            .expect("ptxas runs");
        assert!(
            asm.status.success(),
            "ptxas -arch={sm}: {}",
            String::from_utf8_lossy(&asm.stderr)
        );
        assert!(std::fs::metadata(&cubin).expect("a cubin").len() > 0);
    }
    // Without the tools on its path the same command says what is missing
    // and exits 2 (unless this machine has an NVRTC of its own).
    let out = Command::new(bin("gpu_probe"))
        .args(["--emit-ptx"])
        .arg(dir.path().join("own"))
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("gpu_probe runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        assert!(dir.path().join("own/jacobi2d.ptx").exists(), "{stderr}");
    } else {
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("no NVRTC library"), "{stderr}");
    }
}
