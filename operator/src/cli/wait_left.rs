//! `ductile wait-left`: wait until a node has left its job's view (what the
//! operator's preStop hook runs; exit codes in [`crate::contract`]).

use std::time::{Duration, Instant};

use ductile_coordinator::control::{ControlClient, JobStatus};

use super::job::local_endpoint;
use super::{say, WaitLeftArgs};

/// Whether the node named by `host` (and `pid`, when given) is a member of
/// the view `status` shows. A waiting newcomer is not a member.
pub fn is_member(status: &JobStatus, host: &str, pid: Option<u32>) -> bool {
    status
        .members
        .iter()
        .any(|m| m.host == host && pid.is_none_or(|p| m.pid == p))
}

/// This machine's host name, as a node reports it when it registers.
fn this_host_name() -> Result<String, String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .map_err(|e| format!("cannot read this machine's host name ({e}); pass --host"))
}

/// `ductile wait-left`: polls the job's view until the node has left it
/// (exit codes in [`crate::contract`]).
pub fn wait_left(args: &WaitLeftArgs) -> i32 {
    use crate::contract::{
        WAIT_LEFT_GONE, WAIT_LEFT_STILL_MEMBER, WAIT_LEFT_UNREACHABLE, WAIT_LEFT_UNREACHABLE_AFTER,
        WAIT_LEFT_USAGE,
    };
    let start = Instant::now();
    let deadline = start + args.timeout;
    let host = match args.host.clone().map_or_else(this_host_name, Ok) {
        Ok(host) if !host.is_empty() => host,
        Ok(_) => {
            say("the host name is empty; pass --host");
            return WAIT_LEFT_USAGE;
        }
        Err(problem) => {
            say(&problem);
            return WAIT_LEFT_USAGE;
        }
    };
    let (addr, secret) = match &args.control {
        Some(addr) => {
            let secret = match &args.secret_file {
                Some(path) => crate::contract::secret_from_file(&path.to_string_lossy()),
                None => crate::contract::secret_from_env(),
            };
            match secret {
                Ok(secret) => (addr.clone(), secret),
                Err(e) => {
                    say(&e.to_string());
                    return WAIT_LEFT_USAGE;
                }
            }
        }
        None => match local_endpoint(&args.target, args.timeout) {
            Ok((_, addr, secret)) => (addr, secret),
            Err(err) => {
                say(err.message());
                return WAIT_LEFT_USAGE;
            }
        },
    };
    let who = match args.pid {
        Some(pid) => format!("host {host} pid {pid}"),
        None => format!("host {host}"),
    };
    tracing::info!(%addr, node = %who, timeout = ?args.timeout, "waiting for the node to leave the job");
    let mut client: Option<ControlClient> = None;
    let mut failing_since: Option<Instant> = None;
    loop {
        let answer = match client.as_mut() {
            Some(c) => c.status(),
            None => {
                ControlClient::connect(&addr, &secret, Duration::from_secs(5)).and_then(|mut c| {
                    let status = c.status();
                    client = Some(c);
                    status
                })
            }
        };
        let now = Instant::now();
        match answer {
            Ok(status) => {
                failing_since = None;
                if !is_member(&status, &host, args.pid) {
                    say(&format!(
                        "{who} is not a member of the job at epoch {} (waited {:.1}s)",
                        status.epoch,
                        start.elapsed().as_secs_f64()
                    ));
                    return WAIT_LEFT_GONE;
                }
                tracing::debug!(epoch = status.epoch, node = %who, "still a member");
                if now >= deadline {
                    say(&format!(
                        "{who} is still a member at epoch {} after --timeout ({:.1}s)",
                        status.epoch,
                        args.timeout.as_secs_f64()
                    ));
                    return WAIT_LEFT_STILL_MEMBER;
                }
            }
            Err(error) => {
                client = None;
                let since = *failing_since.get_or_insert(now);
                tracing::info!(%addr, %error, "the control endpoint did not answer");
                if now.duration_since(since) >= WAIT_LEFT_UNREACHABLE_AFTER || now >= deadline {
                    say(&format!(
                        "the job's control endpoint at {addr} did not answer for {:.1}s: {error}",
                        now.duration_since(since).as_secs_f64()
                    ));
                    return WAIT_LEFT_UNREACHABLE;
                }
            }
        }
        std::thread::sleep(args.interval.min(deadline.saturating_duration_since(now)));
    }
}
