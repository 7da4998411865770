//! The launcher's judgement of a running job, as a sans-IO state machine.
//!
//! The driver ([`super::launch`]) reports what it observed (a node or the
//! coordinator ended, the job started, the user asked to stop) together with
//! the time since launch, and asks [`Supervisor::poll`] whether the job has
//! ended and how. No clock and no processes in here, so every rule is tested
//! in virtual time.
//!
//! The rules:
//! - The job ends normally after the runtime's shutdown barrier: every node
//!   and the coordinator exit with the same code. That code is the job's (node
//!   0's; a node that disagrees is reported).
//! - A node killed by a signal is a failure, at any time.
//! - Before the job started (the coordinator's start barrier), any node exit
//!   is a failure: a launch node cannot be replaced. Because a short job can
//!   start and end between two looks at the coordinator, an exit seen before
//!   the start is judged once the coordinator has answered a question asked
//!   after it ([`Supervisor::not_started`] or [`Supervisor::job_started`]).
//! - After it started, a node other than 0 may exit 0 alone: that is a node
//!   departing in a rescale. Node 0's exit, any nonzero exit and the
//!   coordinator's exit begin the *finish*: the remaining nodes must exit
//!   within the grace period, or the job is failed naming the first to go.
//! - The coordinator ending by a signal, or after its launch timeout without
//!   the job having started, is a failure. Before the launch timeout it only
//!   exits after the shutdown barrier, so its exit shows the job did start.
//! - The optional wall-clock limit and a stop request end the job.

use std::fmt;
use std::time::Duration;

use super::process::{signal_name, Exit};

/// Limits the supervisor applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long the other nodes may keep running once the job began to
    /// finish (node 0, the coordinator or a nonzero exit).
    pub exit_grace: Duration,
    /// Wall-clock limit for the whole job.
    pub timeout: Option<Duration>,
    /// The coordinator's launch timeout; the launcher's own backstop fires
    /// this long plus `exit_grace` after launch if the job has not started.
    pub launch_timeout: Option<Duration>,
}

/// Which process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// The launch node with this index.
    Node(usize),
    /// The job's coordinator.
    Coordinator,
}

/// How a job ended, as the supervisor judged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    /// All nodes exited after the shutdown barrier; `code` is node 0's.
    Completed {
        /// The job's exit code.
        code: i32,
        /// Nodes that exited with another code than node 0 (index, code).
        disagreeing: Vec<(usize, i32)>,
    },
    /// Something went wrong; the job must be stopped.
    Failed(Failure),
    /// The wall-clock limit was reached.
    TimedOut {
        /// The limit.
        limit: Duration,
    },
    /// The launcher received this signal.
    Interrupted {
        /// The signal number.
        signal: i32,
    },
}

/// Why a job failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A node was killed by a signal.
    NodeKilled {
        /// The node.
        index: usize,
        /// Its pid.
        pid: u32,
        /// How it ended.
        exit: Exit,
        /// When, since launch.
        at: Duration,
    },
    /// A node exited before the job started.
    NodeExitedBeforeStart {
        /// The node.
        index: usize,
        /// Its pid.
        pid: u32,
        /// How it ended.
        exit: Exit,
        /// When, since launch.
        at: Duration,
    },
    /// The job began to finish but some nodes kept running past the grace period.
    Stragglers {
        /// Who went first.
        first: Who,
        /// Its pid.
        pid: u32,
        /// How it ended.
        exit: Exit,
        /// When, since launch.
        at: Duration,
        /// Nodes still running.
        running: Vec<usize>,
        /// The grace period.
        grace: Duration,
    },
    /// The coordinator ended before the job started, or was killed.
    Coordinator {
        /// How it ended.
        exit: Exit,
        /// When, since launch.
        at: Duration,
        /// Whether the job had started.
        started: bool,
        /// Nodes that had already exited before it (index, exit), as a hint.
        exited_nodes: Vec<(usize, Exit)>,
    },
    /// The job did not start within the launch timeout (the launcher's backstop).
    NotStarted {
        /// The launch timeout.
        launch_timeout: Duration,
    },
    /// Node 0 exited 0 but another node exited with an error.
    Disagreement {
        /// Nodes that disagree (index, code).
        disagreeing: Vec<(usize, i32)>,
    },
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn who(w: Who) -> String {
    match w {
        Who::Node(i) => format!("node {i}"),
        Who::Coordinator => "the coordinator".to_owned(),
    }
}

fn list(nodes: &[usize]) -> String {
    nodes
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::NodeKilled { index, pid, exit, at } => {
                write!(f, "node {index} (pid {pid}) {exit} at {}", secs(*at))
            }
            Failure::NodeExitedBeforeStart { index, pid, exit, at } => write!(
                f,
                "node {index} (pid {pid}) {exit} at {}, before the job started (did it register with the coordinator?)",
                secs(*at)
            ),
            Failure::Stragglers { first, pid, exit, at, running, grace } => {
                let s = if running.len() == 1 { "" } else { "s" };
                write!(
                    f,
                    "{} (pid {pid}) {exit} at {}, but node{s} {} kept running for {} more",
                    who(*first),
                    secs(*at),
                    list(running),
                    secs(*grace)
                )
            }
            Failure::Coordinator { exit, at, started, exited_nodes } => {
                if *started {
                    write!(f, "the coordinator {exit} at {} while the job was running", secs(*at))?;
                } else {
                    write!(
                        f,
                        "the coordinator {exit} at {} before the job started (launch timeout, or a node failed to register)",
                        secs(*at)
                    )?;
                }
                for (index, exit) in exited_nodes {
                    write!(f, "; node {index} had {exit}")?;
                }
                Ok(())
            }
            Failure::NotStarted { launch_timeout } => write!(
                f,
                "the job did not start within the launch timeout ({}): not every node registered",
                secs(*launch_timeout)
            ),
            Failure::Disagreement { disagreeing } => {
                write!(f, "node 0 exited with code 0 but ")?;
                let parts: Vec<String> =
                    disagreeing.iter().map(|(i, c)| format!("node {i} exited with code {c}")).collect();
                f.write_str(&parts.join(", "))
            }
        }
    }
}

impl JobEnd {
    /// The exit code `ductile run` returns for this ending.
    pub fn exit_code(&self) -> i32 {
        match self {
            JobEnd::Completed { code, .. } => *code,
            JobEnd::Failed(_) | JobEnd::TimedOut { .. } => 1,
            JobEnd::Interrupted { signal } => 128 + signal,
        }
    }

    /// The line told to the user, if any (a clean completion says nothing).
    pub fn message(&self) -> Option<String> {
        match self {
            JobEnd::Completed { disagreeing, code } if !disagreeing.is_empty() => {
                let parts: Vec<String> = disagreeing
                    .iter()
                    .map(|(i, c)| format!("node {i} exited with code {c}"))
                    .collect();
                Some(format!(
                    "the job exited with code {code} (node 0's), but {}",
                    parts.join(", ")
                ))
            }
            JobEnd::Completed { .. } => None,
            JobEnd::Failed(failure) => Some(format!("{failure}; stopping the job")),
            JobEnd::TimedOut { limit } => Some(format!(
                "the job ran past its --timeout of {}; stopping the job",
                secs(*limit)
            )),
            JobEnd::Interrupted { signal } => Some(format!(
                "received {}; stopping the job",
                signal_name(*signal)
            )),
        }
    }
}

#[derive(Debug, Clone)]
struct Slot {
    pid: u32,
    exit: Option<(Exit, Duration)>,
}

/// The state machine. See the module docs for the rules.
#[derive(Debug, Clone)]
pub struct Supervisor {
    nodes: Vec<Slot>,
    coordinator: Slot,
    limits: Limits,
    started: bool,
    interrupted: Option<i32>,
    /// The first event of the finish: who, and when.
    finish: Option<(Who, Duration)>,
    end: Option<JobEnd>,
}

impl Supervisor {
    /// A supervisor for nodes with these pids (in launch index order) and the
    /// coordinator with `coordinator_pid`.
    pub fn new(node_pids: &[u32], coordinator_pid: u32, limits: Limits) -> Self {
        Self {
            nodes: node_pids
                .iter()
                .map(|&pid| Slot { pid, exit: None })
                .collect(),
            coordinator: Slot {
                pid: coordinator_pid,
                exit: None,
            },
            limits,
            started: false,
            interrupted: None,
            finish: None,
            end: None,
        }
    }

    /// Whether the job has started (every launch node registered).
    pub fn started(&self) -> bool {
        self.started
    }

    /// The job passed the coordinator's start barrier (the coordinator showed
    /// a view). Node exits seen before this are judged now, in time order.
    pub fn job_started(&mut self) {
        if self.started {
            return;
        }
        self.started = true;
        let mut exits: Vec<(usize, Exit, Duration)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.exit.map(|(e, at)| (i, e, at)))
            .collect();
        exits.sort_by_key(|&(i, _, at)| (at, i));
        for (index, exit, at) in exits {
            self.judge_exit_after_start(index, exit, at);
        }
    }

    /// The coordinator answered, to a question asked at `asked_at`, that the
    /// job has not started. A node that exited before that question can no
    /// longer be part of the job: the launch has failed.
    pub fn not_started(&mut self, asked_at: Duration) {
        if self.started || self.end.is_some() {
            return;
        }
        if let Some((index, pid, exit, at)) = self.earliest_exit(|at| at <= asked_at) {
            self.end = Some(JobEnd::Failed(Failure::NodeExitedBeforeStart {
                index,
                pid,
                exit,
                at,
            }));
        }
    }

    /// Node `index` ended at `now`.
    pub fn node_exited(&mut self, index: usize, exit: Exit, now: Duration) {
        let Some(slot) = self.nodes.get_mut(index) else {
            return;
        };
        if slot.exit.is_some() {
            return;
        }
        slot.exit = Some((exit, now));
        if self.end.is_some() {
            return;
        }
        let pid = slot.pid;
        if let Exit::Signal { .. } = exit {
            self.end = Some(JobEnd::Failed(Failure::NodeKilled {
                index,
                pid,
                exit,
                at: now,
            }));
            return;
        }
        // Before the start is known an exit cannot be judged: a short job may
        // have started and finished between two looks at the coordinator.
        if self.started {
            self.judge_exit_after_start(index, exit, now);
        }
    }

    fn judge_exit_after_start(&mut self, index: usize, exit: Exit, at: Duration) {
        let departing = index != 0 && exit == Exit::Code(0);
        if !departing && self.finish.is_none() {
            self.finish = Some((Who::Node(index), at));
        }
    }

    fn earliest_exit(
        &self,
        when: impl Fn(Duration) -> bool,
    ) -> Option<(usize, u32, Exit, Duration)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.exit.map(|(e, at)| (i, s.pid, e, at)))
            .filter(|&(_, _, _, at)| when(at))
            .min_by_key(|&(i, _, _, at)| (at, i))
    }

    /// The coordinator ended at `now`.
    pub fn coordinator_exited(&mut self, exit: Exit, now: Duration) {
        if self.coordinator.exit.is_some() {
            return;
        }
        self.coordinator.exit = Some((exit, now));
        if self.end.is_some() {
            return;
        }
        let killed = matches!(exit, Exit::Signal { .. });
        // Before its launch timeout the coordinator exits only after the
        // shutdown barrier (or by crashing, which the nodes then show): so the
        // job did start, even if we never saw it.
        let launch_over = self.limits.launch_timeout.is_some_and(|t| now >= t);
        if !self.started && !killed && !launch_over {
            self.job_started();
        }
        if killed || !self.started {
            let exited_nodes = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.exit.map(|(e, _)| (i, e)))
                .collect();
            self.end = Some(JobEnd::Failed(Failure::Coordinator {
                exit,
                at: now,
                started: self.started,
                exited_nodes,
            }));
            return;
        }
        if self.finish.is_none() {
            self.finish = Some((Who::Coordinator, now));
        }
    }

    /// The launcher received `signal`.
    pub fn interrupt(&mut self, signal: i32) {
        if self.interrupted.is_none() {
            self.interrupted = Some(signal);
        }
    }

    /// Whether the job has ended at `now`, and how. Once it returns `Some`, it
    /// keeps returning the same verdict.
    pub fn poll(&mut self, now: Duration) -> Option<JobEnd> {
        if self.end.is_none() {
            self.end = self.judge(now);
        }
        self.end.clone()
    }

    fn judge(&self, now: Duration) -> Option<JobEnd> {
        if let Some(signal) = self.interrupted {
            return Some(JobEnd::Interrupted { signal });
        }
        if let Some((first, since)) = self.finish {
            let running: Vec<usize> = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, s)| s.exit.is_none())
                .map(|(i, _)| i)
                .collect();
            if running.is_empty() {
                return Some(self.completion(since));
            }
            if now >= since + self.limits.exit_grace {
                let (pid, exit) = match first {
                    Who::Node(i) => (self.nodes[i].pid, self.nodes[i].exit.map(|(e, _)| e)),
                    Who::Coordinator => {
                        (self.coordinator.pid, self.coordinator.exit.map(|(e, _)| e))
                    }
                };
                return Some(JobEnd::Failed(Failure::Stragglers {
                    first,
                    pid,
                    exit: exit.unwrap_or(Exit::Code(-1)),
                    at: since,
                    running,
                    grace: self.limits.exit_grace,
                }));
            }
        }
        if let Some(limit) = self.limits.timeout {
            if now >= limit {
                return Some(JobEnd::TimedOut { limit });
            }
        }
        if !self.started {
            // The coordinator did not settle it (no answer, or hung): a node
            // gone this long without the job starting is a failed launch.
            if let Some((index, pid, exit, at)) =
                self.earliest_exit(|at| now >= at + self.limits.exit_grace)
            {
                return Some(JobEnd::Failed(Failure::NodeExitedBeforeStart {
                    index,
                    pid,
                    exit,
                    at,
                }));
            }
        }
        if let Some(launch_timeout) = self.limits.launch_timeout {
            if !self.started && now >= launch_timeout + self.limits.exit_grace {
                return Some(JobEnd::Failed(Failure::NotStarted { launch_timeout }));
            }
        }
        None
    }

    /// Every node has exited and the finish began at `since`.
    fn completion(&self, since: Duration) -> JobEnd {
        let code_of = |s: &Slot| s.exit.and_then(|(e, _)| e.code());
        let code = code_of(&self.nodes[0]).unwrap_or(1);
        // Nodes that left before the finish departed in a rescale: their 0 is
        // not a vote on the job's result.
        let disagreeing: Vec<(usize, i32)> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, s)| s.exit.is_some_and(|(_, at)| at >= since))
            .filter_map(|(i, s)| code_of(s).map(|c| (i, c)))
            .filter(|&(_, c)| c != code)
            .collect();
        // Nodes that disagree with node 0 mean something went wrong beyond the
        // program's own choice of code (a panic, a lost peer): fail the job.
        if !disagreeing.is_empty() {
            JobEnd::Failed(Failure::Disagreement { disagreeing })
        } else {
            JobEnd::Completed { code, disagreeing }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(10);

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    fn sup(n: usize) -> Supervisor {
        let pids: Vec<u32> = (0..n as u32).map(|i| 100 + i).collect();
        Supervisor::new(
            &pids,
            99,
            Limits {
                exit_grace: GRACE,
                timeout: None,
                launch_timeout: None,
            },
        )
    }

    const KILL: Exit = Exit::Signal {
        signal: 9,
        core_dumped: false,
    };

    #[test]
    fn clean_run_passes_node_zeros_code_through() {
        let mut sup = sup(3);
        sup.job_started();
        assert_eq!(sup.poll(s(1.0)), None);
        sup.node_exited(1, Exit::Code(3), s(2.0));
        sup.node_exited(0, Exit::Code(3), s(2.0));
        assert_eq!(sup.poll(s(2.0)), None, "node 2 still running");
        sup.node_exited(2, Exit::Code(3), s(2.1));
        sup.coordinator_exited(Exit::Code(3), s(2.1));
        let end = sup.poll(s(2.1)).unwrap();
        assert_eq!(
            end,
            JobEnd::Completed {
                code: 3,
                disagreeing: vec![]
            }
        );
        assert_eq!(end.exit_code(), 3);
        assert_eq!(end.message(), None);
    }

    #[test]
    fn completion_does_not_wait_for_the_coordinator() {
        let mut sup = sup(1);
        sup.job_started();
        sup.node_exited(0, Exit::Code(0), s(1.0));
        assert_eq!(
            sup.poll(s(1.0)),
            Some(JobEnd::Completed {
                code: 0,
                disagreeing: vec![]
            })
        );
    }

    #[test]
    fn a_killed_node_fails_the_job_with_its_name_pid_and_signal() {
        let mut sup = sup(4);
        sup.job_started();
        sup.node_exited(2, KILL, s(3.2));
        let end = sup.poll(s(3.2)).unwrap();
        assert_eq!(end.exit_code(), 1);
        assert_eq!(
            end.message().unwrap(),
            "node 2 (pid 102) was killed by signal 9 (SIGKILL) at 3.2s; stopping the job"
        );
    }

    #[test]
    fn a_killed_node_fails_the_job_even_while_finishing() {
        let mut sup = sup(2);
        sup.job_started();
        sup.node_exited(0, Exit::Code(0), s(1.0));
        sup.node_exited(1, KILL, s(1.1));
        assert!(matches!(
            sup.poll(s(1.1)),
            Some(JobEnd::Failed(Failure::NodeKilled { index: 1, .. }))
        ));
    }

    fn with_launch_timeout(n: usize, launch_timeout: f64) -> Supervisor {
        let pids: Vec<u32> = (0..n as u32).map(|i| 100 + i).collect();
        Supervisor::new(
            &pids,
            99,
            Limits {
                exit_grace: GRACE,
                timeout: None,
                launch_timeout: Some(s(launch_timeout)),
            },
        )
    }

    #[test]
    fn an_exit_before_the_start_fails_once_the_coordinator_confirms_it() {
        let mut sup = sup(2);
        sup.node_exited(1, Exit::Code(0), s(0.1));
        assert_eq!(
            sup.poll(s(0.1)),
            None,
            "not judged before the coordinator answers"
        );
        sup.not_started(s(0.05));
        assert_eq!(
            sup.poll(s(0.1)),
            None,
            "an answer to an older question proves nothing"
        );
        sup.not_started(s(0.12));
        let end = sup.poll(s(0.12)).unwrap();
        assert!(matches!(
            end,
            JobEnd::Failed(Failure::NodeExitedBeforeStart {
                index: 1,
                pid: 101,
                ..
            })
        ));
        let msg = end.message().unwrap();
        assert!(
            msg.starts_with("node 1 (pid 101) exited with code 0 at 0.1s, before the job started"),
            "{msg}"
        );
    }

    #[test]
    fn an_exit_before_the_start_fails_after_the_grace_period_without_an_answer() {
        let mut sup = sup(2);
        sup.node_exited(0, Exit::Code(0), s(1.0));
        assert_eq!(sup.poll(s(10.9)), None);
        assert!(matches!(
            sup.poll(s(11.0)),
            Some(JobEnd::Failed(Failure::NodeExitedBeforeStart {
                index: 0,
                ..
            }))
        ));
    }

    #[test]
    fn a_job_that_started_and_ended_unseen_completes() {
        // All nodes and the coordinator gone before the first look: the
        // coordinator's exit before its launch timeout shows the job ran.
        let mut sup = with_launch_timeout(2, 60.0);
        sup.node_exited(1, Exit::Code(0), s(0.01));
        sup.node_exited(0, Exit::Code(0), s(0.01));
        assert_eq!(sup.poll(s(0.01)), None);
        sup.coordinator_exited(Exit::Code(0), s(0.02));
        assert_eq!(
            sup.poll(s(0.02)),
            Some(JobEnd::Completed {
                code: 0,
                disagreeing: vec![]
            })
        );
    }

    #[test]
    fn exits_seen_before_the_start_are_judged_once_it_is_seen() {
        let mut sup = sup(3);
        sup.node_exited(1, Exit::Code(5), s(0.5));
        sup.job_started();
        assert_eq!(sup.poll(s(0.6)), None);
        assert!(matches!(
            sup.poll(s(10.5)),
            Some(JobEnd::Failed(Failure::Stragglers {
                first: Who::Node(1),
                ..
            }))
        ));
    }

    #[test]
    fn a_departing_node_is_not_a_failure() {
        let mut sup = sup(3);
        sup.job_started();
        sup.node_exited(2, Exit::Code(0), s(5.0));
        assert_eq!(sup.poll(s(100.0)), None, "a departure starts no clock");
        sup.node_exited(0, Exit::Code(0), s(200.0));
        sup.node_exited(1, Exit::Code(0), s(200.0));
        assert_eq!(
            sup.poll(s(200.0)),
            Some(JobEnd::Completed {
                code: 0,
                disagreeing: vec![]
            })
        );
    }

    #[test]
    fn a_departed_nodes_zero_does_not_disagree_with_a_failing_job() {
        let mut sup = sup(3);
        sup.job_started();
        sup.node_exited(2, Exit::Code(0), s(5.0));
        sup.node_exited(0, Exit::Code(4), s(6.0));
        sup.node_exited(1, Exit::Code(4), s(6.0));
        assert_eq!(
            sup.poll(s(6.0)),
            Some(JobEnd::Completed {
                code: 4,
                disagreeing: vec![]
            })
        );
    }

    #[test]
    fn a_nonzero_exit_with_others_running_fails_after_the_grace_period() {
        let mut sup = sup(3);
        sup.job_started();
        sup.node_exited(1, Exit::Code(7), s(4.0));
        assert_eq!(sup.poll(s(4.0)), None);
        assert_eq!(sup.poll(s(13.9)), None);
        let end = sup.poll(s(14.0)).unwrap();
        assert_eq!(end.exit_code(), 1);
        assert_eq!(
            end.message().unwrap(),
            "node 1 (pid 101) exited with code 7 at 4.0s, but nodes 0, 2 kept running for 10.0s more; stopping the job"
        );
    }

    #[test]
    fn node_zero_exiting_alone_fails_after_the_grace_period() {
        let mut sup = sup(2);
        sup.job_started();
        sup.node_exited(0, Exit::Code(0), s(1.0));
        assert_eq!(sup.poll(s(5.0)), None);
        assert!(matches!(
            sup.poll(s(11.0)),
            Some(JobEnd::Failed(Failure::Stragglers {
                first: Who::Node(0),
                ..
            }))
        ));
    }

    #[test]
    fn the_coordinator_exiting_after_the_start_begins_the_finish() {
        let mut sup = sup(2);
        sup.job_started();
        sup.coordinator_exited(Exit::Code(0), s(1.0));
        assert_eq!(sup.poll(s(1.0)), None);
        let end = sup.poll(s(11.0)).unwrap();
        assert!(end
            .message()
            .unwrap()
            .starts_with("the coordinator (pid 99) exited with code 0 at 1.0s"));
    }

    #[test]
    fn node_zero_ok_but_another_node_failed_is_a_failure() {
        let mut sup = sup(2);
        sup.job_started();
        sup.node_exited(0, Exit::Code(0), s(1.0));
        sup.node_exited(1, Exit::Code(2), s(1.0));
        let end = sup.poll(s(1.0)).unwrap();
        assert_eq!(
            end,
            JobEnd::Failed(Failure::Disagreement {
                disagreeing: vec![(1, 2)]
            })
        );
        assert_eq!(end.exit_code(), 1);
    }

    #[test]
    fn nodes_disagreeing_with_a_failing_node_zero_fail_the_job() {
        let mut sup = sup(2);
        sup.job_started();
        sup.node_exited(0, Exit::Code(3), s(1.0));
        sup.node_exited(1, Exit::Code(1), s(1.0));
        let end = sup.poll(s(1.0)).unwrap();
        assert_eq!(end.exit_code(), 1);
        assert!(end.message().unwrap().contains("node 1 exited with code 1"));
    }

    #[test]
    fn the_coordinator_giving_up_on_the_launch_fails_the_job() {
        let mut sup = with_launch_timeout(2, 2.0);
        sup.node_exited(1, Exit::Code(0), s(0.5));
        sup.coordinator_exited(Exit::Code(3), s(2.0));
        let msg = sup.poll(s(2.0)).unwrap().message().unwrap();
        assert!(
            msg.starts_with("the coordinator exited with code 3 at 2.0s before the job started"),
            "{msg}"
        );
        assert!(msg.contains("node 1 had exited with code 0"), "{msg}");
    }

    #[test]
    fn a_killed_coordinator_fails_the_job() {
        let mut sup = sup(2);
        sup.job_started();
        sup.coordinator_exited(KILL, s(2.0));
        let msg = sup.poll(s(2.0)).unwrap().message().unwrap();
        assert!(msg.starts_with("the coordinator was killed by signal 9 (SIGKILL) at 2.0s while the job was running"), "{msg}");
    }

    #[test]
    fn the_launchers_backstop_fires_when_nothing_starts() {
        let mut sup = with_launch_timeout(2, 2.0);
        assert_eq!(sup.poll(s(11.9)), None);
        assert!(matches!(
            sup.poll(s(12.0)),
            Some(JobEnd::Failed(Failure::NotStarted { .. }))
        ));
        let mut started = with_launch_timeout(2, 2.0);
        started.job_started();
        assert_eq!(started.poll(s(100.0)), None);
    }

    #[test]
    fn the_wall_clock_limit_ends_the_job() {
        let mut sup = Supervisor::new(
            &[1],
            2,
            Limits {
                exit_grace: GRACE,
                timeout: Some(s(5.0)),
                launch_timeout: None,
            },
        );
        sup.job_started();
        assert_eq!(sup.poll(s(4.9)), None);
        let end = sup.poll(s(5.0)).unwrap();
        assert_eq!(end, JobEnd::TimedOut { limit: s(5.0) });
        assert_eq!(end.exit_code(), 1);
        assert!(end.message().unwrap().contains("--timeout of 5.0s"));
    }

    #[test]
    fn an_interrupt_ends_the_job_with_the_shell_code() {
        let mut sup = sup(2);
        sup.interrupt(2);
        let end = sup.poll(s(0.0)).unwrap();
        assert_eq!(end.exit_code(), 130);
        assert_eq!(end.message().unwrap(), "received SIGINT; stopping the job");
    }

    #[test]
    fn the_verdict_is_sticky() {
        let mut sup = sup(2);
        sup.job_started();
        sup.node_exited(0, KILL, s(1.0));
        let first = sup.poll(s(1.0));
        sup.node_exited(1, Exit::Code(0), s(1.1));
        sup.interrupt(15);
        assert_eq!(sup.poll(s(50.0)), first);
    }
}
