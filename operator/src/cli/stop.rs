//! `ductile stop`: stops a running local job the way Ctrl-C in its `ductile
//! run` terminal would (SIGTERM to the launcher, which stops every process
//! group of the job and records the outcome), and waits until it is gone.

use std::time::Instant;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::job::running_launcher;
use super::status::describe_outcome;
use super::{say, StopArgs, EXIT_FAILED, EXIT_USAGE};
use crate::local::process::{pid_alive, POLL_INTERVAL};
use crate::state::{read_job_state, resolve_state_dir};

/// `ductile stop`; returns the exit code: 0 stopped, 1 still running at
/// --timeout, 2 no running job (or a bad job name).
pub fn stop(args: &StopArgs) -> i32 {
    let dir = match resolve_state_dir(args.target.state_dir.as_deref(), &args.target.job, |k| {
        std::env::var_os(k)
    }) {
        Ok(dir) => dir,
        Err(err) => {
            say(&err.to_string());
            return EXIT_USAGE;
        }
    };
    let Some(pid) = running_launcher(&dir) else {
        say(&format!("no running job in {}", dir.display()));
        return EXIT_USAGE;
    };
    let Ok(raw) = i32::try_from(pid) else {
        say(&format!("launcher pid {pid} is out of range"));
        return EXIT_FAILED;
    };
    if let Err(e) = kill(Pid::from_raw(raw), Signal::SIGTERM) {
        say(&format!("cannot signal the launcher (pid {pid}): {e}"));
        return EXIT_FAILED;
    }
    say(&format!("asked the launcher (pid {pid}) to stop the job"));
    let deadline = Instant::now() + args.timeout;
    while pid_alive(pid) {
        if Instant::now() >= deadline {
            say(&format!(
                "the launcher (pid {pid}) still runs after --timeout ({:.1}s)",
                args.timeout.as_secs_f64()
            ));
            return EXIT_FAILED;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    match read_job_state(&dir).ok().and_then(|s| s.outcome) {
        Some(outcome) => say(&format!("stopped: {}", describe_outcome(&outcome))),
        None => say("stopped"),
    }
    0
}
