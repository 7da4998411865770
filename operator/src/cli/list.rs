//! `ductile list`: the jobs under the state root, running or ended, from
//! their state directories (`job.json` and whether the launcher still runs).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::job::running_launcher;
use super::{say, ListArgs, EXIT_FAILED, EXIT_USAGE};
use crate::state::{read_job_state, resolve_state_dir, JobState, DEFAULT_JOB, JOB_FILE};

/// One job as `ductile list` shows it.
#[derive(Debug, Serialize, PartialEq)]
pub struct Listed {
    /// The job name.
    pub job: String,
    /// Its state directory.
    pub state_dir: PathBuf,
    /// `running`, or how it ended (`completed`, `failed`, ...).
    pub state: String,
    /// The exit code of an ended job.
    pub exit_code: Option<i32>,
    /// Nodes at launch, and PEs per node.
    pub nodes: u32,
    /// PEs per node.
    pub pes_per_node: u32,
    /// The launcher's pid (running jobs).
    pub launcher_pid: Option<u32>,
    /// The program and its arguments.
    pub program: String,
}

/// The listing of one state directory, if it holds a job record.
pub fn listed(dir: &Path, state: &JobState, launcher: Option<u32>) -> Listed {
    let ended = state.outcome.as_ref();
    Listed {
        job: state.job.clone(),
        state_dir: dir.to_path_buf(),
        state: match (launcher, ended) {
            (Some(_), _) => "running".to_owned(),
            (None, Some(outcome)) => serde_json::to_value(outcome.result)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| "ended".to_owned()),
            // A record without an outcome and no launcher: it was killed.
            (None, None) => "lost".to_owned(),
        },
        exit_code: ended.filter(|_| launcher.is_none()).map(|o| o.exit_code),
        nodes: state.shape.nodes,
        pes_per_node: state.shape.pes_per_node,
        launcher_pid: launcher,
        program: state.program.join(" "),
    }
}

/// The table form.
pub fn render(jobs: &[Listed]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<20} {:<10} {:>5} {:>5} {:>4}  program",
        "job", "state", "code", "nodes", "PEs"
    );
    for j in jobs {
        let code = j.exit_code.map_or("-".to_owned(), |c| c.to_string());
        let _ = writeln!(
            out,
            "{:<20} {:<10} {:>5} {:>5} {:>4}  {}",
            j.job, j.state, code, j.nodes, j.pes_per_node, j.program
        );
    }
    out
}

/// `ductile list`; returns the exit code.
pub fn list(args: &ListArgs) -> i32 {
    let root = match &args.root {
        Some(root) => root.clone(),
        None => match resolve_state_dir(None, DEFAULT_JOB, |k| std::env::var_os(k)) {
            Ok(dir) => dir.parent().map(Path::to_path_buf).unwrap_or(dir),
            Err(err) => {
                say(&err.to_string());
                return EXIT_USAGE;
            }
        },
    };
    let mut jobs = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&root) {
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        dirs.sort();
        for dir in dirs {
            if !dir.join(JOB_FILE).exists() {
                continue;
            }
            match read_job_state(&dir) {
                Ok(state) => jobs.push(listed(&dir, &state, running_launcher(&dir))),
                Err(err) => say(&format!("skipping {}: {err}", dir.display())),
            }
        }
    }
    if args.json {
        match serde_json::to_string_pretty(&jobs) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                say(&format!("cannot encode the list: {e}"));
                return EXIT_FAILED;
            }
        }
    } else if jobs.is_empty() {
        say(&format!("no jobs under {}", root.display()));
    } else {
        print!("{}", render(&jobs));
    }
    0
}
