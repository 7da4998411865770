//! The contract between a fleet and the processes of a job, in one place.
//!
//! **Environment.** The variables a fleet sets on every node it starts are
//! named once, in `ductile_coordinator::contract`; this module re-exports
//! them so the fleets in this crate never spell a name twice. `docs/cli.md`
//! has their table.
//!
//! **Leaving before the end (the preStop hook).** A pod being deleted (a
//! spot instance reclaimed, a drain, a `kubectl delete pod`) must not take
//! its chares with it: its node must first leave the job through a rescale
//! that evacuates it. The operator puts a `preStop` hook on every spot pod:
//!
//! ```text
//! ductile wait-left --control {job}-0.{job}.{namespace}.svc:7071 --timeout {grace - 5}
//! ```
//!
//! ([`wait_left_command`]), run in the node's own container, so the image
//! must have `ductile` on its `PATH` (`docker/apps.Dockerfile` does). It
//! reads the job secret from the container's contract variables
//! ([`ENV_SECRET`] / [`ENV_SECRET_FILE`]) and names the node by the host name
//! it registered with (a pod's host name is the pod's name), then asks PE 0's
//! control endpoint for the view until that node is no longer a member.
//! Meanwhile the operator reads the pod's deletion as an interruption
//! notice whose deadline is the deletion timestamp, and the policy removes
//! the node (evacuation, commit, the coordinator's Die). The pod's
//! `terminationGracePeriodSeconds` is the spec's
//! `rescalePolicy.interruptionDeadlineSeconds` (unless the template sets
//! one), so Kubernetes waits that long for the hook before it kills the
//! container; the hook gives up [`PRESTOP_MARGIN_S`] seconds earlier, with
//! its own exit code rather than a kill. A template that brings its own
//! `preStop` hook on the node container keeps it, and no hook is set when
//! the grace period is 0.
//!
//! Exit codes of `ductile wait-left` (the kubelet only logs them; they say
//! why the hook ended):
//!
//! | code | constant | meaning |
//! |---|---|---|
//! | 0 | [`WAIT_LEFT_GONE`] | the node is not, or no longer, a member of the view (a waiting newcomer is not a member) |
//! | 1 | [`WAIT_LEFT_STILL_MEMBER`] | `--timeout` passed and the node is still a member |
//! | 2 | [`WAIT_LEFT_USAGE`] | bad arguments, no job secret, no local job |
//! | 3 | [`WAIT_LEFT_UNREACHABLE`] | the control endpoint did not answer for [`WAIT_LEFT_UNREACHABLE_AFTER`] in a row, or at the deadline (node 0 is gone: the job is over) |

use std::time::Duration;

/// The runtime option that turns on its in-memory buddy checkpoints, one
/// every K-th load-balancing sync point, and the recovery from a member
/// lost without notice (issue 20): `+ft-every K`. The operator appends it to
/// every pod's node container with `spec.faultTolerance`; the local
/// launcher reads it from the program's arguments.
pub const FT_EVERY_FLAG: &str = "+ft-every";

/// Port of the coordinator in node 0's pod.
pub const COORDINATOR_PORT: i32 = 7070;
/// Port of PE 0's control endpoint (rescale requests) in node 0's pod.
pub const CONTROL_PORT: i32 = 7071;

pub use ductile_coordinator::contract::*;

/// The `ductile` subcommand a preStop hook runs.
pub const WAIT_LEFT_SUBCOMMAND: &str = "wait-left";
/// `ductile wait-left`: the node is not (or no longer) a member of the view.
pub const WAIT_LEFT_GONE: i32 = 0;
/// `ductile wait-left`: the timeout passed while the node is still a member.
pub const WAIT_LEFT_STILL_MEMBER: i32 = 1;
/// `ductile wait-left`: bad arguments, no secret, no local job.
pub const WAIT_LEFT_USAGE: i32 = 2;
/// `ductile wait-left`: the control endpoint did not answer.
pub const WAIT_LEFT_UNREACHABLE: i32 = 3;
/// How long the control endpoint may fail to answer, in a row, before
/// `ductile wait-left` gives up: PE 0 is gone, so is the job.
pub const WAIT_LEFT_UNREACHABLE_AFTER: Duration = Duration::from_secs(10);
/// Seconds between the hook's own deadline and the end of the pod's grace
/// period (the kubelet kills the container then).
pub const PRESTOP_MARGIN_S: i64 = 5;

/// The preStop hook's command for a pod whose grace period is
/// `grace_seconds`; `None` when there is no time to wait (0 or less).
pub fn wait_left_command(control_address: &str, grace_seconds: i64) -> Option<Vec<String>> {
    if grace_seconds <= 0 {
        return None;
    }
    let timeout = (grace_seconds - PRESTOP_MARGIN_S).max(1);
    Some(vec![
        "ductile".to_owned(),
        WAIT_LEFT_SUBCOMMAND.to_owned(),
        "--control".to_owned(),
        control_address.to_owned(),
        "--timeout".to_owned(),
        timeout.to_string(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_waits_the_grace_period_less_the_margin() {
        assert_eq!(
            wait_left_command("j-0.j.ns.svc:7071", 120).unwrap(),
            [
                "ductile",
                "wait-left",
                "--control",
                "j-0.j.ns.svc:7071",
                "--timeout",
                "115"
            ]
        );
        // A short grace period still leaves the hook a second.
        assert_eq!(wait_left_command("a:1", 3).unwrap()[5], "1");
        assert_eq!(wait_left_command("a:1", 0), None);
        assert_eq!(wait_left_command("a:1", -4), None);
    }
}
