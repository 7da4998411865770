//! `ductile cloud`: rehearse an ElasticJob on the local cloud (see
//! [`crate::cloud`] and docs/cloud.md).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::{parse_secs, say, EXIT_USAGE};
use crate::cloud::driver::{Mode, RunOptions};
use crate::cloud::{rehearse, CloudError, Loaded};
use crate::state::resolve_state_dir;

/// Arguments of `ductile cloud`.
#[derive(Args, Debug, Clone)]
pub struct CloudArgs {
    /// The ElasticJob manifest (the YAML you would `kubectl apply`).
    #[arg(long, short = 'f', value_name = "JOB.yaml")]
    pub file: PathBuf,
    /// The scenario: instance types, the fleet, and what the cloud does when.
    #[arg(long, short = 's', value_name = "SCENARIO.yaml")]
    pub scenario: PathBuf,
    /// Where job.log, cloud.json and cloud.svg go [default: STATE_DIR/cloud].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The launcher's state directory [default: as `ductile run --job NAME`].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Skip the uninterrupted reference run that checks the checksum.
    #[arg(long)]
    pub no_verify: bool,
    /// Stop the job after this many real seconds.
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub timeout: Option<Duration>,
    /// Check the job and the scenario, print the plan, and run nothing.
    #[arg(long)]
    pub check: bool,
    /// How the policy's rescales are carried out. `live`: the running
    /// processes are reconfigured (the product). The papers' baselines
    /// (each needs `network: loopback`): `restart`: checkpoint at the next
    /// sync point, end every process, relaunch at the new size, restore
    /// and rebalance; `restart-no-lb`: the same without the rebalancing
    /// step; `checkpoint-restart`: periodic disk checkpoints
    /// (`--checkpoint-every`), and a rescale kills every process and
    /// relaunches from the last one, redoing the work since.
    #[arg(long, value_enum, default_value = "live")]
    pub mode: Mode,
    /// With `--mode checkpoint-restart`: checkpoint the job to disk every
    /// SECS simulated seconds (the scenario's clock).
    #[arg(long, value_name = "SECS", value_parser = parse_secs, required_if_eq("mode", "checkpoint-restart"))]
    pub checkpoint_every: Option<Duration>,
}

/// Runs the job of `args.file` on the cloud of `args.scenario`; prints the
/// events (a live status line on a terminal), then the summary. Exit codes:
/// 0 the job completed with the checksum of an uninterrupted run, 1 it
/// failed or the checksum differs, 2 invalid input or the job could not
/// start, 130/143 stopped by a signal.
pub fn cloud(args: CloudArgs) -> i32 {
    let loaded = match Loaded::from_files(&args.file, &args.scenario) {
        Ok(l) => l,
        Err(e) => {
            say(&e.to_string());
            return EXIT_USAGE;
        }
    };
    if args.checkpoint_every.is_some() && args.mode != Mode::CheckpointRestart {
        say("--checkpoint-every needs --mode checkpoint-restart");
        return EXIT_USAGE;
    }
    if args.check {
        println!("{}", plan(&loaded));
        return 0;
    }
    let state_dir = match resolve_state_dir(args.state_dir.as_deref(), &loaded.name, |k| {
        std::env::var_os(k)
    }) {
        Ok(dir) => dir,
        Err(e) => {
            say(&e.to_string());
            return EXIT_USAGE;
        }
    };
    let out = args.out.clone().unwrap_or_else(|| state_dir.join("cloud"));
    let mut opts = RunOptions::new(state_dir, out);
    opts.timeout = args.timeout;
    opts.mode = args.mode;
    opts.checkpoint_every = args.checkpoint_every;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        if let Err(e) = signal_hook::flag::register(signal, Arc::clone(&stop)) {
            say(&format!("cannot install signal handlers: {e}"));
            return EXIT_USAGE;
        }
    }
    println!("{}", plan(&loaded));
    match rehearse(&loaded, &opts, !args.no_verify, &stop, &mut |line| {
        println!("{line}")
    }) {
        Ok((_, code)) => code,
        Err(e @ (CloudError::Launch(_) | CloudError::Io(..))) => {
            say(&e.to_string());
            EXIT_USAGE
        }
        Err(CloudError::Interrupted) => 130,
        Err(e) => {
            say(&e.to_string());
            EXIT_USAGE
        }
    }
}

/// What will run, in a few lines.
fn plan(loaded: &Loaded) -> String {
    let s = &loaded.scenario;
    let mut lines = vec![format!(
        "job {}: {} {} on {} nodes, {} PEs ({} on demand), policy {:?}, time factor {}",
        loaded.name,
        loaded.program,
        loaded.args.join(" "),
        loaded.replicas,
        loaded.launch_pes().iter().sum::<u32>(),
        loaded.on_demand,
        loaded.policy.mode,
        s.time_factor
    )];
    for (name, capacity, itype) in loaded.launch_instances() {
        let pes = s.pes_of(&itype);
        lines.push(format!("  {name:<16} {capacity:?} {itype} ({pes} PE{})", if pes == 1 { "" } else { "s" }));
    }
    lines.push(format!(
        "  {} scripted events{}",
        loaded.scripted.len(),
        if s.random.is_some() {
            ", and a seeded random trace"
        } else {
            ""
        }
    ));
    lines.join("\n")
}
