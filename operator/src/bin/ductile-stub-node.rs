//! `ductile-stub-node`: the smallest process that follows the environment
//! contract, for testing fleets (the local one, later Kubernetes) without the
//! runtime. It registers as the launch member its environment names, waits
//! for the start, optionally works (sleeps), enters the shutdown barrier with
//! `--code` (node 0's becomes the job's) and exits with the job's code, as a
//! real node does. Node 0 prints one line on stdout.
//!
//! `ductile-stub-node [--code C] [--work SECS] [--fail-node I --fail-code C]`
//!
//! `--fail-node I`: node I exits with `--fail-code` (default 1) right after
//! the start, without the shutdown barrier: a node that fails mid-job.

use std::process::ExitCode;
use std::time::Duration;

use ductile_coordinator::contract::{self, role_from_env, secret_from_env};
use ductile_coordinator::{Admission, Client, Registration};

fn arg_value(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn run() -> Result<i32, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code: i32 = arg_value(&args, "--code")
        .map_or(Ok(0), |v| v.parse())
        .map_err(|e| format!("--code: {e}"))?;
    let fail_node: Option<u32> = arg_value(&args, "--fail-node")
        .map(|v| v.parse())
        .transpose()
        .map_err(|e| format!("--fail-node: {e}"))?;
    let fail_code: i32 = arg_value(&args, "--fail-code")
        .map_or(Ok(1), |v| v.parse())
        .map_err(|e| format!("--fail-code: {e}"))?;
    let work: f64 = arg_value(&args, "--work")
        .map_or(Ok(0.0), |v| v.parse())
        .map_err(|e| format!("--work: {e}"))?;

    let addr = std::env::var(contract::ENV_COORDINATOR)
        .map_err(|_| format!("{} is not set", contract::ENV_COORDINATOR))?;
    let secret = secret_from_env().map_err(|e| e.to_string())?;
    let role = role_from_env().map_err(|e| e.to_string())?;
    let pes = std::env::var(contract::ENV_PES)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);

    let client =
        Client::connect(&addr, &secret, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let reg = Registration {
        role,
        address: Vec::new(),
        pes,
        host: "localhost".to_owned(),
        pid: std::process::id(),
        fingerprint: 0x5eed,
    };
    let (node, view) = match client
        .register(reg, Duration::from_secs(600))
        .map_err(|e| e.to_string())?
    {
        Admission::Member { node, view } => (node, view),
        Admission::Waiting { .. } => {
            return Err("the stub node does not wait as a newcomer".to_owned())
        }
    };
    if node == 0 {
        println!(
            "stub: job started with {} nodes, {} PEs",
            view.members.len(),
            view.total_pes()
        );
    }
    if fail_node == Some(node) {
        eprintln!("ductile-stub-node: node {node} failing with code {fail_code} as asked");
        return Ok(fail_code);
    }
    std::thread::sleep(Duration::from_secs_f64(work.max(0.0)));
    let vote = if node == 0 { code } else { 0 };
    let job_code = client
        .shutdown_barrier(view.epoch, vote, Duration::from_secs(600))
        .map_err(|e| e.to_string())?;
    client.close();
    Ok(job_code)
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(err) => {
            eprintln!("ductile-stub-node: {err}");
            ExitCode::from(2)
        }
    }
}
