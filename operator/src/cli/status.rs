//! `ductile status`: a running job's membership, from node 0's control
//! endpoint, and the newcomers its launcher started.

use std::fmt::Write as _;

use ductile_coordinator::control::JobStatus;
use serde::Serialize;

use super::job::{connect_job, Unreachable};
use super::{say, StatusArgs, EXIT_FAILED, EXIT_USAGE};
use crate::state::{read_job_state, NewcomerRecord};

/// `ductile status --json`: the job's status, plus the newcomers its
/// launcher started (from `job.json`).
#[derive(Serialize)]
struct StatusOutput<'a> {
    #[serde(flatten)]
    status: &'a JobStatus,
    launcher_newcomers: &'a [NewcomerRecord],
}

/// `ductile status`: asks the running job's node 0 through its control endpoint.
pub fn status(args: StatusArgs) -> i32 {
    let mut job = match connect_job(&args.target) {
        Ok(job) => job,
        Err(err @ Unreachable::Usage(_)) => {
            say(err.message());
            return EXIT_USAGE;
        }
        Err(err) => {
            say(err.message());
            return EXIT_FAILED;
        }
    };
    let status = match job.client.status() {
        Ok(s) => s,
        Err(e) => {
            say(&format!(
                "cannot reach the job's control endpoint at {}: {e}",
                job.addr
            ));
            return EXIT_FAILED;
        }
    };
    // Newcomers are the launcher's to report; a job started otherwise has none.
    let newcomers = read_job_state(&job.dir)
        .map(|state| state.newcomers)
        .unwrap_or_default();
    if args.json {
        let output = StatusOutput {
            status: &status,
            launcher_newcomers: &newcomers,
        };
        match serde_json::to_string_pretty(&output) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                say(&format!("cannot encode the status: {e}"));
                return EXIT_FAILED;
            }
        }
        return 0;
    }
    print!("{}", render_status(&status, &newcomers));
    0
}

/// The human form of `ductile status`.
pub fn render_status(status: &JobStatus, newcomers: &[NewcomerRecord]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "epoch {}  nodes {}  PEs {}  pending newcomers {}  up {:.1}s",
        status.epoch,
        status.members.len(),
        status.pes,
        status.pending.len(),
        status.uptime_ms as f64 / 1e3
    );
    let _ = writeln!(
        out,
        "{:>5} {:>6} {:>4} {:>8}  host",
        "node", "uid", "PEs", "pid"
    );
    for m in &status.members {
        let _ = writeln!(
            out,
            "{:>5} {:>6} {:>4} {:>8}  {}",
            m.node, m.uid, m.pes, m.pid, m.host
        );
    }
    for p in &status.pending {
        let _ = writeln!(
            out,
            "pending newcomer uid {} ({} PEs, pid {}, {})",
            p.uid, p.pes, p.pid, p.host
        );
    }
    if !newcomers.is_empty() {
        let _ = writeln!(out, "newcomers started by the launcher:");
        let _ = writeln!(out, "{:>9} {:>8}  state", "newcomer", "pid");
        for (n, record) in newcomers.iter().enumerate() {
            let _ = writeln!(out, "{n:>9} {:>8}  {}", record.pid, record.describe());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lists_the_launchers_newcomers() {
        use ductile_coordinator::proto::{Member, PendingNewcomer};
        let member = |node: u32, pid: u32| Member {
            node,
            uid: u64::from(node) + 1,
            address: vec![],
            pes: 2,
            host: "vm".into(),
            pid,
        };
        let status = JobStatus {
            epoch: 2,
            members: vec![member(0, 10), member(1, 11), member(2, 20)],
            pes: 6,
            pending: vec![PendingNewcomer {
                uid: 9,
                pes: 2,
                host: "vm".into(),
                pid: 21,
            }],
            uptime_ms: 2500,
        };
        let record = |pid: u32, admitted: bool, exit: Option<&str>| NewcomerRecord {
            pid,
            pes: 2,
            started_at_unix_ms: 0,
            admitted,
            dropped: exit.is_some() && !admitted,
            exit: exit.map(str::to_owned),
        };
        let newcomers = [
            record(20, true, None),
            record(21, false, None),
            record(22, false, Some("exited with code 3")),
        ];
        let text = render_status(&status, &newcomers);
        let want = "\
epoch 2  nodes 3  PEs 6  pending newcomers 1  up 2.5s
 node    uid  PEs      pid  host
    0      1    2       10  vm
    1      2    2       11  vm
    2      3    2       20  vm
pending newcomer uid 9 (2 PEs, pid 21, vm)
newcomers started by the launcher:
 newcomer      pid  state
        0       20  admitted
        1       21  waiting
        2       22  dropped: exited with code 3 before admission
";
        assert_eq!(text, want);
        assert!(!render_status(&status, &[]).contains("launcher"));

        let json = serde_json::to_value(StatusOutput {
            status: &status,
            launcher_newcomers: &newcomers,
        })
        .unwrap();
        assert_eq!(json["epoch"], 2);
        assert_eq!(json["launcher_newcomers"][2]["exit"], "exited with code 3");
    }
}
