//! `ductile status`: a running job's membership, from node 0's control
//! endpoint, and the newcomers its launcher started.

use std::fmt::Write as _;

use ductile_coordinator::control::JobStatus;

use super::job::{connect_job, running_launcher, Unreachable};
use super::{say, StatusArgs, EXIT_FAILED, EXIT_USAGE};
use crate::state::{
    read_job_state, resolve_state_dir, NewcomerCounts, NewcomerRecord, Outcome, NEWCOMER_RECORDS,
};

/// `ductile status --json`: the job's status (member addresses as text),
/// plus the newcomers its launcher started (from `job.json`).
fn status_json(
    status: &JobStatus,
    newcomers: &[NewcomerRecord],
    counts: &NewcomerCounts,
) -> serde_json::Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(members) = value.get_mut("members").and_then(|m| m.as_array_mut()) {
        for (json, member) in members.iter_mut().zip(&status.members) {
            json["address"] = serde_json::Value::String(address_text(&member.address));
        }
    }
    value["running"] = serde_json::Value::Bool(true);
    value["launcher_newcomers"] = serde_json::to_value(newcomers).unwrap_or_default();
    value["launcher_newcomer_counts"] = serde_json::to_value(counts).unwrap_or_default();
    value
}

/// The launcher's counts over every newcomer of the job, in one line, when
/// it started any: its list (`job.json`) keeps the running ones and only
/// the last [`NEWCOMER_RECORDS`] that ended.
pub fn render_newcomer_counts(counts: &NewcomerCounts) -> Option<String> {
    (counts.started > 0).then(|| {
        format!(
            "newcomers in all: {} started, {} admitted, {} dropped before admission, {} ended \
             (listed: those running and the last {NEWCOMER_RECORDS} that ended)\n",
            counts.started, counts.admitted, counts.dropped, counts.ended
        )
    })
}

/// A member's transport address as text: itself when it is printable
/// (`127.0.0.1:40123` for TCP), else hex (a UCX worker address).
pub fn address_text(address: &[u8]) -> String {
    match std::str::from_utf8(address) {
        Ok(text) if text.chars().all(|c| c.is_ascii_graphic()) => text.to_owned(),
        _ => address.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// One line on how a job ended.
pub fn describe_outcome(outcome: &Outcome) -> String {
    let result = serde_json::to_value(outcome.result)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut line = format!(
        "{result}, exit code {}, after {:.1}s",
        outcome.exit_code, outcome.elapsed_s
    );
    if !outcome.message.is_empty() {
        let _ = write!(line, ": {}", outcome.message);
    }
    line
}

/// `ductile status`: asks the running job's node 0 through its control
/// endpoint; a job that is starting is waited for (--timeout); for an ended
/// job, how it ended (from `job.json`).
pub fn status(args: StatusArgs) -> i32 {
    let mut job = match connect_job(&args.target, args.timeout) {
        Ok(job) => job,
        Err(err @ Unreachable::Usage(_)) => {
            say(err.message());
            return EXIT_USAGE;
        }
        Err(err) => return ended_job_status(&args, err.message()),
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
    let (newcomers, counts) = read_job_state(&job.dir)
        .map(|state| (state.newcomers, state.newcomer_counts))
        .unwrap_or_default();
    if args.json {
        match serde_json::to_string_pretty(&status_json(&status, &newcomers, &counts)) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                say(&format!("cannot encode the status: {e}"));
                return EXIT_FAILED;
            }
        }
        return 0;
    }
    print!("{}", render_status(&status, &newcomers));
    print!("{}", render_newcomer_counts(&counts).unwrap_or_default());
    0
}

/// No running job: how the last one in that state directory ended, if
/// `job.json` says (exit 0), else `why` (exit 2).
fn ended_job_status(args: &StatusArgs, why: &str) -> i32 {
    let outcome = resolve_state_dir(args.target.state_dir.as_deref(), &args.target.job, |k| {
        std::env::var_os(k)
    })
    .ok()
    .filter(|dir| running_launcher(dir).is_none())
    .and_then(|dir| read_job_state(&dir).ok())
    .and_then(|state| state.outcome.map(|o| (state.job, o)));
    let Some((name, outcome)) = outcome else {
        say(why);
        return EXIT_USAGE;
    };
    if args.json {
        let value = serde_json::json!({ "job": name, "running": false, "outcome": outcome });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        println!(
            "job {name} is not running; it ended: {}",
            describe_outcome(&outcome)
        );
    }
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
        for record in newcomers {
            let n = record.number;
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
            address: format!("127.0.0.1:{}", 40000 + node).into_bytes(),
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
            number: (pid - 20) as usize,
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

        let counts = NewcomerCounts {
            started: 1065,
            admitted: 691,
            dropped: 8,
            ended: 1060,
        };
        assert_eq!(
            render_newcomer_counts(&counts),
            Some(format!(
                "newcomers in all: 1065 started, 691 admitted, 8 dropped before admission, 1060 ended \
                 (listed: those running and the last {NEWCOMER_RECORDS} that ended)\n"
            ))
        );
        assert_eq!(render_newcomer_counts(&NewcomerCounts::default()), None);
        let json = status_json(&status, &newcomers, &counts);
        assert_eq!(json["launcher_newcomer_counts"]["started"], 1065);
        assert_eq!(json["epoch"], 2);
        assert_eq!(json["launcher_newcomers"][2]["exit"], "exited with code 3");
        assert_eq!(json["members"][1]["address"], "127.0.0.1:40001", "as text");
        assert_eq!(json["running"], true);
        assert_eq!(
            address_text(&[0, 1, 0xab]),
            "0001ab",
            "binary addresses in hex"
        );
    }
}
