//! `ductile run`: run a job on the local fleet ([`crate::local::launch`]).

use super::{say, RunArgs, EXIT_FAILED, EXIT_USAGE};
use crate::local::{launch, JobSpec, StopRequest};
use crate::state::resolve_state_dir;

/// `ductile run`: builds the [`JobSpec`], runs it, reports; returns the exit code.
pub fn run(args: RunArgs) -> i32 {
    let state_dir = match resolve_state_dir(args.state_dir.as_deref(), &args.job, |k| {
        std::env::var_os(k)
    }) {
        Ok(dir) => dir,
        Err(err) => {
            say(&err.to_string());
            return EXIT_USAGE;
        }
    };
    let mut command = args.command.into_iter();
    let Some(program) = command.next() else {
        say("no PROGRAM given");
        return EXIT_USAGE;
    };
    let mut spec = JobSpec::new(
        program,
        command.collect(),
        args.nodes,
        args.pes_per_node,
        state_dir,
    );
    spec.node_pes = args.node_pes;
    spec.node_cgroups = args.node_cgroups;
    spec.job = args.job;
    spec.transport = args.transport;
    spec.bind = args.bind;
    spec.launch_timeout = args.launch_timeout;
    spec.heartbeat_timeout = Some(args.heartbeat_timeout).filter(|t| !t.is_zero());
    spec.timeout = args.timeout;
    spec.exit_grace = args.exit_grace;
    spec.coordinator_restarts = args.coordinator_restarts;
    spec.metrics_port = args.metrics_port;
    spec.restore = args.restore;
    match std::env::current_exe() {
        Ok(exe) => spec.coordinator_exe = exe,
        Err(err) => {
            say(&format!(
                "cannot find the ductile executable to start the coordinator: {err}"
            ));
            return EXIT_USAGE;
        }
    }

    let stop = StopRequest::new();
    if let Err(err) = stop.install_signal_handlers() {
        say(&format!("cannot install signal handlers: {err}"));
        return EXIT_USAGE;
    }
    match launch(&spec, &stop, &mut |line| say(line)) {
        Ok(report) if !report.all_stopped => EXIT_FAILED,
        Ok(report) => report.exit_code(),
        Err(err) => {
            say(&err.to_string());
            err.exit_code()
        }
    }
}
