//! The launcher's judgement of a running job, as a sans-IO state machine.
//!
//! The driver ([`super::launch`]) reports what it observed (a node, a
//! newcomer or the coordinator ended, the coordinator showed a view, the user
//! asked to stop) together with the time since launch, and asks
//! [`Supervisor::poll`] whether the job has ended and how. No clock and no
//! processes in here, so every rule is tested in virtual time.
//!
//! The rules:
//! - The job ends normally after the runtime's shutdown barrier: every member
//!   and the coordinator exit with the same code. That code is the job's (node
//!   0's; a member that disagrees is reported).
//! - A launch node killed by a signal is a failure, at any time, unless
//!   the job runs with fault tolerance ([`Limits::recovery`], the runtime's
//!   `+ft-every K`): then a member other than node 0 killed after the start
//!   and before the finish is judged by the views asked for after its death.
//!   The runtime's recovery commits a view without it (node 0 rolls every
//!   survivor back to the last in-memory checkpoint): one that no longer
//!   lists its pid means the job recovered, which is said once, and the job
//!   goes on. A view that still lists it is no verdict (the recovery's
//!   commit takes time); past the recovery bound plus the grace with no
//!   view without it, the job fails naming the node. A finish that begins
//!   meanwhile ends with the kill as its cause, unless every member then
//!   exits 0 (only a recovered job ends that way).
//! - Before the job started (the coordinator's start barrier), any node exit
//!   is a failure: a launch node cannot be replaced. Because a short job can
//!   start and end between two looks at the coordinator, an exit seen before
//!   the start is judged once the coordinator has answered a question asked
//!   after it ([`Supervisor::not_started`] or [`Supervisor::members_seen`]).
//! - After it started, a node other than 0 may exit 0 alone: that is a node
//!   departing in a rescale. Node 0's exit, any nonzero exit and the
//!   coordinator's exit begin the *finish*: the remaining members must exit
//!   within the grace period, or the job is failed naming the first to go.
//!   A launch node other than 0 that exits with an error code is judged by
//!   a view asked for after its exit, while the coordinator is up: one the
//!   view no longer lists had been
//!   removed by a rescale (a departing node cut off before it heard so) and
//!   is only reported; one it lists begins the finish at its exit, as does
//!   one with no view within the grace or any other event of the finish.
//! - The coordinator ending after its launch timeout without the job having
//!   started, or by a signal before the start, is a failure. Before the
//!   launch timeout it only exits after the shutdown barrier, so its exit
//!   shows the job did start.
//! - Once the job started, the coordinator can be restarted: its nodes rejoin
//!   a new one on the same address (node 0 restores it with its view). While
//!   the job runs (its finish has not begun) a coordinator killed by a signal
//!   is restarted at once; one that exits with a code is restarted unless a
//!   member exits within the settle period (then it was the shutdown barrier
//!   ending, and its exit begins the finish as before). At most
//!   [`Limits::coordinator_restarts`] attempts per job, successful or not,
//!   [`RESTART_BACKOFF`] apart; a coordinator that is down with none left
//!   fails the job. Once the finish has begun it is not restarted: a killed
//!   one fails the job, an exit is part of the finish.
//! - A newcomer (a node started while the job runs, waiting for a rescale to
//!   admit it) that ends before it was admitted is dropped, whatever its exit:
//!   the job never counted on it. Once the coordinator's view shows it as a
//!   member (matched by the pid it reported), it is judged as a launch node
//!   other than 0 is. Whether an exited newcomer had been admitted is settled
//!   by a view asked for after its exit: a member that dies stays in the view
//!   until the job removes it, a removed or never-admitted one is not there.
//!   Without such an answer within the grace period it counts as dropped.
//!   Views are samples: a newcomer can be admitted and removed again between
//!   two looks. So the record follows the coordinator's admission history
//!   too ([`Supervisor::admissions_seen`], asked for with every view): a
//!   newcomer whose pid the history lists, admitted in an epoch later than
//!   the last one seen when it was started, was admitted, and its exit is
//!   judged as a member's (exit 0: it departed). Only without that history
//!   (an older coordinator), when the epoch jumped, is such a newcomer left
//!   undecided: not a failure, and not called dropped either.
//!   A newcomer whose end has been judged is let go
//!   ([`Supervisor::forget_settled`]) while the job is not finishing: the
//!   supervisor holds only the newcomers that still run or wait for a
//!   judgement, however many rescales the job goes through.
//! - A member that still runs although the views no longer list it (a
//!   hung node the coordinator declared lost and the job recovered
//!   without, or a departing node that hung after its hand-over) is no
//!   longer part of the job: `exit_grace` after the first view without it
//!   the launcher kills it ([`Supervisor::take_fenced`]), and that end is
//!   reported, not judged. Node 0 is never fenced. (The driver asks for
//!   views all along only for a job with fault tolerance; without, a hung
//!   node ends the job and is stopped with the rest.)
//! - The optional wall-clock limit and a stop request end the job.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use ductile_coordinator::proto::Epoch;

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
    /// How many times the coordinator may be restarted while the job runs
    /// (every attempt counts, successful or not); 0: never.
    pub coordinator_restarts: u32,
    /// How long a coordinator that exited with a code while the job ran
    /// waits for a member to exit too (the shutdown barrier ended) before
    /// it is taken for lost and restarted.
    pub coordinator_settle: Duration,
    /// With fault tolerance (the program runs with `+ft-every K`): how long
    /// the runtime's recovery may take to commit a view without a member
    /// killed by a signal (its rescale stage bound); the supervisor waits
    /// this plus `exit_grace` for such a view. `None`: a killed member
    /// fails the job at once.
    pub recovery: Option<Duration>,
}

/// Pause between two attempts at restarting the coordinator.
pub const RESTART_BACKOFF: Duration = Duration::from_millis(500);

/// Which process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// The launch node with this index.
    Node(usize),
    /// The newcomer started `n`-th (from 0) while the job ran.
    Newcomer(usize),
    /// The job's coordinator.
    Coordinator,
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Who::Node(i) => write!(f, "node {i}"),
            Who::Newcomer(n) => write!(f, "newcomer {n}"),
            Who::Coordinator => f.write_str("the coordinator"),
        }
    }
}

/// How a job ended, as the supervisor judged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    /// All members exited after the shutdown barrier; `code` is node 0's.
    Completed {
        /// The job's exit code.
        code: i32,
        /// Members that exited with another code than node 0 (who, code).
        disagreeing: Vec<(Who, i32)>,
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
    /// With fault tolerance: a member killed by a signal was still in
    /// every view asked for within the recovery bound plus the grace.
    NotRecovered {
        /// Which one.
        who: Who,
        /// Its pid.
        pid: u32,
        /// How it ended.
        exit: Exit,
        /// When, since launch.
        at: Duration,
        /// How long the supervisor waited for a view without it.
        waited: Duration,
    },
    /// A launch node or an admitted newcomer was killed by a signal.
    NodeKilled {
        /// Which one.
        who: Who,
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
    /// The job began to finish but some members kept running past the grace period.
    Stragglers {
        /// Who went first.
        first: Who,
        /// Its pid.
        pid: u32,
        /// How it ended.
        exit: Exit,
        /// When, since launch.
        at: Duration,
        /// Members still running.
        running: Vec<Who>,
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
    /// The coordinator went away while the job ran and was not restarted.
    CoordinatorNotRestarted {
        /// How it ended.
        exit: Exit,
        /// When, since launch.
        at: Duration,
        /// Why not.
        why: NotRestarted,
    },
    /// The job did not start within the launch timeout (the launcher's backstop).
    NotStarted {
        /// The launch timeout.
        launch_timeout: Duration,
    },
    /// Node 0 exited 0, or aborted because it lost a peer
    /// ([`EXIT_NODE_ABORTED`]), and another member exited with an error.
    Disagreement {
        /// Node 0's code.
        code: i32,
        /// Members that disagree (who, code).
        disagreeing: Vec<(Who, i32)>,
    },
}

/// Why a lost coordinator was not restarted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotRestarted {
    /// The job used up its restarts before this loss.
    NoneLeft {
        /// Restarts the job had (all allowed).
        restarts: u32,
    },
    /// Every attempt left failed.
    Failed {
        /// Attempts made for this loss.
        attempts: u32,
        /// Why the last one failed.
        last: String,
    },
}

/// A newcomer that ended while not a member of the job: not a failure, but
/// worth a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// Which newcomer (start order).
    pub newcomer: usize,
    /// Its pid.
    pub pid: u32,
    /// How it ended.
    pub exit: Exit,
    /// When, since launch.
    pub at: Duration,
    /// Whether it surely was never admitted: the launcher saw every view
    /// since it started. False when a rescale may have admitted and another
    /// removed it between two looks.
    pub never_admitted: bool,
}

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (who, pid, exit, at) = (
            Who::Newcomer(self.newcomer),
            self.pid,
            self.exit,
            secs(self.at),
        );
        if self.never_admitted {
            write!(f, "{who} (pid {pid}) {exit} at {at} before it was admitted; dropped (the job goes on)")
        } else {
            write!(
                f,
                "{who} (pid {pid}) {exit} at {at}, not a member of the job (never admitted, or admitted and removed between two looks); the job goes on"
            )
        }
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// `nodes 0, 2 and newcomer 1`.
fn list(whos: &[Who]) -> String {
    let group = |word: &str, ids: Vec<usize>| -> Option<String> {
        let s = if ids.len() == 1 { "" } else { "s" };
        let ids: Vec<String> = ids.iter().map(usize::to_string).collect();
        (!ids.is_empty()).then(|| format!("{word}{s} {}", ids.join(", ")))
    };
    let nodes = whos.iter().filter_map(|w| match w {
        Who::Node(i) => Some(*i),
        _ => None,
    });
    let newcomers = whos.iter().filter_map(|w| match w {
        Who::Newcomer(n) => Some(*n),
        _ => None,
    });
    [
        group("node", nodes.collect()),
        group("newcomer", newcomers.collect()),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(" and ")
}

fn disagreement(disagreeing: &[(Who, i32)]) -> String {
    disagreeing
        .iter()
        .map(|(w, c)| format!("{w} exited with code {c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::NodeKilled { who, pid, exit, at } => {
                write!(f, "{who} (pid {pid}) {exit} at {}", secs(*at))
            }
            Failure::NotRecovered {
                who,
                pid,
                exit,
                at,
                waited,
            } => write!(
                f,
                "{who} (pid {pid}) {exit} at {} and the job did not recover without it within {} (the coordinator's view still lists it)",
                secs(*at),
                secs(*waited)
            ),
            Failure::NodeExitedBeforeStart {
                index,
                pid,
                exit,
                at,
            } => write!(
                f,
                "node {index} (pid {pid}) {exit} at {}, before the job started ({})",
                secs(*at),
                if exit.code() == Some(EXIT_PROGRAM_USAGE) {
                    "the program refused its arguments: see its message above"
                } else {
                    "did it register with the coordinator?"
                }
            ),
            Failure::Stragglers {
                first,
                pid,
                exit,
                at,
                running,
                grace,
            } => write!(
                f,
                "{first} (pid {pid}) {exit} at {}, but {} kept running for {} more",
                secs(*at),
                list(running),
                secs(*grace)
            ),
            Failure::Coordinator {
                exit,
                at,
                started,
                exited_nodes,
            } => {
                if *started {
                    write!(
                        f,
                        "the coordinator {exit} at {} while the job was running",
                        secs(*at)
                    )?;
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
            Failure::CoordinatorNotRestarted { exit, at, why } => {
                write!(
                    f,
                    "the coordinator {exit} at {} while the job was running and was not restarted: ",
                    secs(*at)
                )?;
                match why {
                    NotRestarted::NoneLeft { restarts } => {
                        let s = if *restarts == 1 { "" } else { "s" };
                        write!(
                            f,
                            "it had been restarted {restarts} time{s} already, the most allowed"
                        )
                    }
                    NotRestarted::Failed { attempts, last } => {
                        let s = if *attempts == 1 { "" } else { "s" };
                        write!(f, "{attempts} attempt{s} failed, the last: {last}")
                    }
                }
            }
            Failure::NotStarted { launch_timeout } => write!(
                f,
                "the job did not start within the launch timeout ({}): not every node registered",
                secs(*launch_timeout)
            ),
            Failure::Disagreement { code, disagreeing } => {
                let why = if *code == EXIT_NODE_ABORTED {
                    " (it lost a peer)"
                } else {
                    ""
                };
                write!(
                    f,
                    "node 0 exited with code {code}{why} but {}",
                    disagreement(disagreeing)
                )
            }
        }
    }
}

/// The code a program exits with when it refuses its arguments (clap's,
/// and `ductile run`'s own usage code).
pub const EXIT_PROGRAM_USAGE: i32 = 2;

/// The code a node exits with when it ended because it lost a peer or its
/// coordinator (the runtime's `EXIT_ABORTED`): a consequence, never a
/// program's verdict.
pub const EXIT_NODE_ABORTED: i32 = 3;

impl JobEnd {
    /// The exit code `ductile run` returns for this ending.
    pub fn exit_code(&self) -> i32 {
        match self {
            JobEnd::Completed { code, .. } => *code,
            // A program that refused its arguments before joining is a
            // usage error of the whole command.
            JobEnd::Failed(Failure::NodeExitedBeforeStart { exit, .. })
                if exit.code() == Some(EXIT_PROGRAM_USAGE) =>
            {
                EXIT_PROGRAM_USAGE
            }
            JobEnd::Failed(_) | JobEnd::TimedOut { .. } => 1,
            JobEnd::Interrupted { signal } => 128 + signal,
        }
    }

    /// The line told to the user, if any (a clean completion says nothing).
    pub fn message(&self) -> Option<String> {
        match self {
            JobEnd::Completed { disagreeing, code } if !disagreeing.is_empty() => Some(format!(
                "node 0 exited with code {code}, the job's code ({} after it; see node 0's output above for why)",
                disagreement(disagreeing)
            )),
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
    /// It exited with an error code and a view asked for after its exit
    /// is to say whether it was still a member (launch nodes other than 0).
    awaiting_view: bool,
    /// It was killed by a signal while the job runs with fault tolerance: a
    /// view asked for after its death that no longer lists it says the job
    /// recovered without it.
    recovering: bool,
    /// Whether the views still list it while it runs.
    absence: Absence,
}

/// A running member's absence from the views: a process the job no longer
/// counts on, fenced once it outlasts the grace.
#[derive(Debug, Clone, Copy, Default)]
struct Absence {
    /// When the first view that no longer lists it was asked for (reset
    /// by a view that lists it again).
    since: Option<Duration>,
    /// The launcher was told to kill it.
    fenced: bool,
}

impl Absence {
    fn seen(&mut self, listed: bool, asked_at: Duration) {
        if listed {
            self.since = None;
        } else {
            self.since.get_or_insert(asked_at);
        }
    }

    /// Whether it is due to be fenced at `now`.
    fn due(&self, now: Duration, grace: Duration) -> bool {
        !self.fenced && self.since.is_some_and(|since| now >= since + grace)
    }
}

#[derive(Debug, Clone)]
struct NewcomerSlot {
    pid: u32,
    spawned_at: Duration,
    exit: Option<(Exit, Duration)>,
    /// Seen as a member of the view: from then on judged as a member.
    admitted: bool,
    /// The epoch that admitted it (once `admitted`): an older view cannot
    /// list it, so its absence from one says nothing.
    admitted_in: Epoch,
    /// Its exit has been judged (as a member's, or as a drop).
    judged: bool,
    /// Killed by a signal as a member, with fault tolerance: waits for a
    /// view without it (see [`Slot::recovering`]).
    recovering: bool,
    /// Whether a view asked for after its start has been seen.
    followed: bool,
    /// A commit happened unseen since it was followed (the epoch jumped).
    missed_commit: bool,
    /// The latest epoch seen when it was started: an admission of its pid
    /// in this epoch or before is another process's (a pid reused).
    epoch_at_spawn: Epoch,
    /// Once admitted: whether the views still list it while it runs.
    absence: Absence,
}

/// A coordinator lost while the job runs, to be restarted.
#[derive(Debug, Clone)]
struct Down {
    /// How it ended, and when.
    exit: Exit,
    at: Duration,
    /// When the next attempt is due.
    due: Duration,
    /// Attempts made for this loss (all failed so far), and the last error.
    attempts: u32,
    last_error: Option<String>,
}

/// The state machine. See the module docs for the rules.
#[derive(Debug, Clone)]
pub struct Supervisor {
    nodes: Vec<Slot>,
    /// Newcomers by number, until their end is judged and let go.
    newcomers: BTreeMap<usize, NewcomerSlot>,
    /// The number the next newcomer gets (those below it and not in
    /// `newcomers` were let go, settled).
    next_newcomer: usize,
    coordinator: Slot,
    limits: Limits,
    started: bool,
    interrupted: Option<i32>,
    /// The first event of the finish: who, and when.
    finish: Option<(Who, Duration)>,
    end: Option<JobEnd>,
    /// Newcomers judged dropped and not yet taken by [`Supervisor::take_dropped`].
    dropped: Vec<Dropped>,
    /// Lines for the user not yet taken by [`Supervisor::take_notes`].
    notes: Vec<String>,
    /// The epoch of the latest view seen.
    epoch: Option<Epoch>,
    /// The coordinator, lost while the job runs, waiting to be restarted.
    down: Option<Down>,
    /// Restart attempts so far in the job.
    restart_attempts: u32,
    /// Killed members the job recovered without (fault tolerance).
    recoveries: u32,
    /// Members to kill, not yet taken by [`Supervisor::take_fenced`].
    fence: Vec<(Who, u32)>,
}

impl Supervisor {
    /// A supervisor for nodes with these pids (in launch index order) and the
    /// coordinator with `coordinator_pid`.
    pub fn new(node_pids: &[u32], coordinator_pid: u32, limits: Limits) -> Self {
        Self {
            nodes: node_pids
                .iter()
                .map(|&pid| Slot {
                    pid,
                    exit: None,
                    awaiting_view: false,
                    recovering: false,
                    absence: Absence::default(),
                })
                .collect(),
            newcomers: BTreeMap::new(),
            next_newcomer: 0,
            coordinator: Slot {
                pid: coordinator_pid,
                exit: None,
                awaiting_view: false,
                recovering: false,
                absence: Absence::default(),
            },
            limits,
            started: false,
            interrupted: None,
            finish: None,
            end: None,
            dropped: Vec::new(),
            notes: Vec::new(),
            epoch: None,
            down: None,
            restart_attempts: 0,
            recoveries: 0,
            fence: Vec::new(),
        }
    }

    /// Whether the job has started (every launch node registered).
    pub fn started(&self) -> bool {
        self.started
    }

    /// The job passed the coordinator's start barrier (the coordinator showed
    /// a view, or node 0, which waits for it, published its control
    /// endpoint). Node exits seen before this are judged now, in time order.
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
            self.judge_exit_after_start(Who::Node(index), exit, at);
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

    /// The coordinator answered, to a question asked at `asked_at`, with the
    /// view of `epoch` whose members reported these pids: the job has
    /// started, and newcomers among them are admitted.
    pub fn members_seen(&mut self, asked_at: Duration, epoch: Epoch, member_pids: &[u32]) {
        self.job_started();
        let skipped = self.epoch.is_some_and(|seen| epoch > seen + 1);
        self.epoch = Some(self.epoch.map_or(epoch, |seen| seen.max(epoch)));
        for n in self.newcomer_numbers() {
            let Some(slot) = self.newcomers.get_mut(&n) else {
                continue;
            };
            if slot.admitted || slot.judged || asked_at < slot.spawned_at {
                continue;
            }
            // Two commits since the last view seen before its start (or
            // since its last look) may have admitted and removed it unseen.
            let unseen = if slot.followed {
                skipped
            } else {
                epoch > slot.epoch_at_spawn + 1
            };
            if unseen {
                slot.missed_commit = true;
            }
            slot.followed = true;
            if member_pids.contains(&slot.pid) {
                slot.admitted = true;
                slot.admitted_in = epoch;
                // Already gone: it died (or left) as a member.
                if let Some((exit, at)) = slot.exit {
                    slot.judged = true;
                    let pid = slot.pid;
                    self.judge_member_exit(Who::Newcomer(n), pid, exit, at);
                }
            } else if let Some((exit, at)) = slot.exit.filter(|&(_, at)| at <= asked_at) {
                self.drop_newcomer(n, exit, at);
            }
        }
        self.judge_awaiting(asked_at, member_pids);
        self.judge_recovering(asked_at, member_pids);
        self.note_absences(asked_at, epoch, member_pids);
    }

    /// Running members (launch nodes but node 0, admitted newcomers) the
    /// view of `epoch` asked for at `asked_at` lists, or not. A newcomer
    /// admitted by a later epoch is not judged by it: the admission history
    /// is asked for after the view, so it may list a commit the view
    /// predates.
    fn note_absences(&mut self, asked_at: Duration, epoch: Epoch, member_pids: &[u32]) {
        let running = self.nodes.iter_mut().skip(1).filter(|s| s.exit.is_none());
        for slot in running {
            slot.absence.seen(member_pids.contains(&slot.pid), asked_at);
        }
        let admitted = self
            .newcomers
            .values_mut()
            .filter(|s| s.admitted && s.admitted_in <= epoch && s.exit.is_none());
        for slot in admitted {
            slot.absence.seen(member_pids.contains(&slot.pid), asked_at);
        }
    }

    /// Members the launcher is to kill since the last call: each still ran
    /// `exit_grace` after the first view without it. Their end is reported
    /// when it comes, not judged.
    pub fn take_fenced(&mut self) -> Vec<(Who, u32)> {
        std::mem::take(&mut self.fence)
    }

    /// Marks the members absent past the grace at `now` as fenced.
    fn fence_absent(&mut self, now: Duration) {
        let grace = self.limits.exit_grace;
        let nodes = self
            .nodes
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| s.exit.is_none())
            .map(|(i, s)| (Who::Node(i), s.pid, &mut s.absence));
        let newcomers = self
            .newcomers
            .iter_mut()
            .filter(|(_, s)| s.exit.is_none())
            .map(|(&n, s)| (Who::Newcomer(n), s.pid, &mut s.absence));
        for (who, pid, absence) in nodes.chain(newcomers) {
            if !absence.due(now, grace) {
                continue;
            }
            absence.fenced = true;
            let since = absence.since.unwrap_or_default();
            self.notes.push(format!(
                "{who} (pid {pid}) still runs {} after a view without it (at {}): the job no longer counts on it (declared lost, or removed by a rescale); killing it",
                secs(now - since),
                secs(since)
            ));
            self.fence.push((who, pid));
        }
    }

    /// The coordinator's recent admissions, `(epoch, pid)` each, asked for
    /// after the view given next to [`Supervisor::members_seen`] (give them
    /// first): newcomers they list are admitted, whether or not a view showed
    /// them as members, so one admitted and removed between two looks is
    /// recorded as admitted, not dropped.
    pub fn admissions_seen(&mut self, admitted: &[(Epoch, u32)]) {
        for n in self.newcomer_numbers() {
            let Some(slot) = self.newcomers.get_mut(&n) else {
                continue;
            };
            if slot.admitted || slot.judged {
                continue;
            }
            let listed = admitted
                .iter()
                .filter(|&&(epoch, pid)| pid == slot.pid && epoch > slot.epoch_at_spawn)
                .map(|&(epoch, _)| epoch)
                .max();
            let Some(epoch) = listed else {
                continue;
            };
            slot.admitted = true;
            slot.admitted_in = epoch;
            if let Some((exit, at)) = slot.exit {
                slot.judged = true;
                let pid = slot.pid;
                self.judge_member_exit(Who::Newcomer(n), pid, exit, at);
            }
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
        let pid = slot.pid;
        if slot.absence.fenced {
            self.notes
                .push(format!("node {index} (pid {pid}), fenced, {exit}"));
            return;
        }
        // Before the start is known an exit cannot be judged: a short job may
        // have started and finished between two looks at the coordinator.
        // A signal can: no job ends its nodes that way.
        if self.started || matches!(exit, Exit::Signal { .. }) {
            self.judge_member_exit(Who::Node(index), pid, exit, now);
        }
    }

    /// The number the next newcomer spawned gets.
    pub fn next_newcomer(&self) -> usize {
        self.next_newcomer
    }

    /// A newcomer with this pid was started at `now` (at the user's request,
    /// while the job runs); returns its number, `k` for the `k`-th from 0.
    pub fn newcomer_spawned(&mut self, pid: u32, now: Duration) -> usize {
        let n = self.next_newcomer;
        self.next_newcomer += 1;
        let slot = NewcomerSlot {
            pid,
            spawned_at: now,
            exit: None,
            admitted: false,
            admitted_in: 0,
            judged: false,
            recovering: false,
            followed: false,
            missed_commit: false,
            epoch_at_spawn: self.epoch.unwrap_or(0),
            absence: Absence::default(),
        };
        self.newcomers.insert(n, slot);
        n
    }

    /// Newcomer `n` ended at `now`.
    pub fn newcomer_exited(&mut self, n: usize, exit: Exit, now: Duration) {
        let Some(slot) = self.newcomers.get_mut(&n) else {
            return;
        };
        if slot.exit.is_some() {
            return;
        }
        slot.exit = Some((exit, now));
        if slot.absence.fenced {
            slot.judged = true;
            let pid = slot.pid;
            self.notes
                .push(format!("{} (pid {pid}), fenced, {exit}", Who::Newcomer(n)));
            return;
        }
        if slot.admitted {
            slot.judged = true;
            let pid = slot.pid;
            self.judge_member_exit(Who::Newcomer(n), pid, exit, now);
        }
        // Otherwise a view asked for after this exit settles it.
    }

    /// Whether newcomer `n` ended and its end has been judged (as a
    /// member's, or as a drop): nothing about it will change any more. One
    /// let go ([`Supervisor::forget_settled`]) was.
    pub fn newcomer_settled(&self, n: usize) -> bool {
        self.newcomers
            .get(&n)
            .map_or(n < self.next_newcomer, |s| s.judged)
    }

    /// Whether newcomer `n` has been seen as a member (false once it was
    /// let go: its record took that in before).
    pub fn newcomer_admitted(&self, n: usize) -> bool {
        self.newcomers.get(&n).is_some_and(|s| s.admitted)
    }

    /// Whether newcomer `n` may be stopped without harm: it is running and
    /// has not been seen as a member.
    pub fn newcomer_waiting(&self, n: usize) -> bool {
        self.newcomers
            .get(&n)
            .is_some_and(|s| !s.admitted && s.exit.is_none())
    }

    /// Whether the supervisor still holds newcomer `n` (started, and not
    /// let go by [`Supervisor::forget_settled`]).
    pub fn holds_newcomer(&self, n: usize) -> bool {
        self.newcomers.contains_key(&n)
    }

    /// How many newcomers the supervisor holds now.
    pub fn newcomers_held(&self) -> usize {
        self.newcomers.len()
    }

    /// Lets go of the newcomers whose end has been judged (departed
    /// members, drops, taken by [`Supervisor::take_dropped`] or not): their
    /// verdict is in, and their exit can no longer weigh on the job's,
    /// since only a member's nonzero exit (which begins the finish) or its
    /// signal (which fails the job) does. Nothing is let go once the job
    /// is finishing or has ended. Returns the numbers let go, in order.
    pub fn forget_settled(&mut self) -> Vec<usize> {
        if self.finish.is_some() || self.end.is_some() {
            return Vec::new();
        }
        let settled: Vec<usize> = self
            .newcomers
            .iter()
            .filter(|(_, s)| s.judged && !s.recovering && s.exit.is_some())
            .map(|(&n, _)| n)
            .collect();
        for n in &settled {
            self.newcomers.remove(n);
        }
        settled
    }

    /// The numbers of the newcomers held, in order (to walk them while
    /// changing the supervisor).
    fn newcomer_numbers(&self) -> Vec<usize> {
        self.newcomers.keys().copied().collect()
    }

    /// Newcomers judged dropped since the last call, in the order judged.
    pub fn take_dropped(&mut self) -> Vec<Dropped> {
        std::mem::take(&mut self.dropped)
    }

    /// Whether new newcomers may be started now: not once the job is ending.
    pub fn accepts_newcomers(&self) -> Result<(), String> {
        if let Some(signal) = self.interrupted {
            return Err(format!(
                "the launcher received {} and is stopping the job",
                signal_name(signal)
            ));
        }
        if self.end.is_some() || self.finish.is_some() {
            return Err("the job is ending".to_owned());
        }
        Ok(())
    }

    /// Whether the driver should keep asking the coordinator for its view:
    /// until the job started, and while a newcomer's admission is unknown.
    pub fn wants_views(&self) -> bool {
        self.end.is_none()
            && (!self.started
                || self.newcomers.values().any(|s| !s.admitted && !s.judged)
                || self.nodes.iter().any(|s| s.awaiting_view)
                || self.recovering().next().is_some())
    }

    fn drop_newcomer(&mut self, n: usize, exit: Exit, at: Duration) {
        let Some(slot) = self.newcomers.get_mut(&n) else {
            return;
        };
        slot.judged = true;
        self.dropped.push(Dropped {
            newcomer: n,
            pid: slot.pid,
            exit,
            at,
            never_admitted: slot.followed && !slot.missed_commit,
        });
    }

    /// A member (launch node, or admitted newcomer) ended at `at`, after the
    /// start: a signal fails the job (with fault tolerance, unless the job
    /// recovers without it), other exits may begin the finish.
    fn judge_member_exit(&mut self, who: Who, pid: u32, exit: Exit, at: Duration) {
        if self.end.is_some() {
            return;
        }
        self.settle_coordinator();
        if let Exit::Signal { .. } = exit {
            let recoverable = self.limits.recovery.is_some()
                && self.started
                && self.finish.is_none()
                && who != Who::Node(0);
            if recoverable {
                match who {
                    Who::Node(i) => self.nodes[i].recovering = true,
                    Who::Newcomer(n) => {
                        if let Some(slot) = self.newcomers.get_mut(&n) {
                            slot.recovering = true;
                        }
                    }
                    Who::Coordinator => {}
                }
                return;
            }
            self.end = Some(JobEnd::Failed(Failure::NodeKilled { who, pid, exit, at }));
            return;
        }
        self.judge_exit_after_start(who, exit, at);
    }

    fn judge_exit_after_start(&mut self, who: Who, exit: Exit, at: Duration) {
        self.settle_coordinator();
        let departing = who != Who::Node(0) && exit == Exit::Code(0);
        if departing {
            return;
        }
        if let (Who::Node(i), Exit::Code(_)) = (who, exit) {
            // Only a coordinator that is up can answer (one that is down
            // stops its restarts at this exit, as before).
            if i != 0 && self.finish.is_none() && self.down.is_none() {
                // A node removed by a rescale that never heard so (cut off
                // after its hand-over) ends with an error code although the
                // job went on without it: a view asked for after its exit
                // tells a removed node from a member that failed.
                self.nodes[i].awaiting_view = true;
                return;
            }
        }
        self.begin_finish(who, at);
    }

    /// Begins the finish with `who` at `at`, unless it has begun. A node
    /// whose exit awaits a view is judged a member now (its exit may be
    /// what ended the others): the finish begins with the earliest of them.
    fn begin_finish(&mut self, who: Who, at: Duration) {
        if self.finish.is_some() {
            return;
        }
        let awaiting = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, s)| s.awaiting_view)
            .filter_map(|(i, s)| s.exit.map(|(_, t)| (t, i)))
            .min();
        for slot in &mut self.nodes {
            slot.awaiting_view = false;
        }
        self.finish = Some(match awaiting {
            Some((t, i)) if t <= at => (Who::Node(i), t),
            _ => (who, at),
        });
    }

    /// Nodes whose exit awaited a view: the view asked for at `asked_at`
    /// lists the pids of the members.
    fn judge_awaiting(&mut self, asked_at: Duration, member_pids: &[u32]) {
        for i in 0..self.nodes.len() {
            let slot = &self.nodes[i];
            let Some((exit, at)) = slot.exit.filter(|_| slot.awaiting_view) else {
                continue;
            };
            if asked_at < at {
                continue;
            }
            let pid = slot.pid;
            self.nodes[i].awaiting_view = false;
            if member_pids.contains(&pid) {
                self.begin_finish(Who::Node(i), at);
            } else {
                self.notes.push(format!(
                    "node {i} (pid {pid}) {exit} after a rescale had removed it; the job goes on without it"
                ));
            }
        }
    }

    /// Members killed while the job runs with fault tolerance, not yet
    /// seen gone from a view: (who, pid, exit, when), in no set order.
    fn recovering(&self) -> impl Iterator<Item = (Who, u32, Exit, Duration)> + '_ {
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, s)| s.recovering)
            .filter_map(|(i, s)| s.exit.map(|(e, at)| (Who::Node(i), s.pid, e, at)));
        let newcomers = self
            .newcomers
            .iter()
            .filter(|(_, s)| s.recovering)
            .filter_map(|(&n, s)| s.exit.map(|(e, at)| (Who::Newcomer(n), s.pid, e, at)));
        nodes.chain(newcomers)
    }

    fn stop_recovering(&mut self, who: Who) {
        match who {
            Who::Node(i) => self.nodes[i].recovering = false,
            Who::Newcomer(n) => {
                if let Some(slot) = self.newcomers.get_mut(&n) {
                    slot.recovering = false;
                }
            }
            Who::Coordinator => {}
        }
    }

    /// Killed members whose recovery awaits a view: the view asked for at
    /// `asked_at` lists the pids of the members. One it no longer lists was
    /// removed by the runtime's recovery; one it lists is not judged yet.
    fn judge_recovering(&mut self, asked_at: Duration, member_pids: &[u32]) {
        let recovered: Vec<(Who, u32, Exit)> = self
            .recovering()
            .filter(|&(_, pid, _, at)| asked_at >= at && !member_pids.contains(&pid))
            .map(|(who, pid, exit, _)| (who, pid, exit))
            .collect();
        for (who, pid, exit) in recovered {
            self.stop_recovering(who);
            self.recoveries += 1;
            self.notes.push(format!(
                "{who} (pid {pid}) {exit}; the job recovered without it"
            ));
        }
    }

    /// Members killed while the job runs with fault tolerance and seen
    /// gone from a view since the launch: the job recovered without them.
    pub fn recoveries(&self) -> u32 {
        self.recoveries
    }

    /// Lines for the user about exits that did not end the job.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
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

    /// A member exited while the coordinator, gone with an exit code, has
    /// not been restarted yet: it was the shutdown barrier ending, and the
    /// coordinator's exit begins the finish.
    fn settle_coordinator(&mut self) {
        let Some(down) = &self.down else { return };
        if down.attempts == 0 && down.exit.code().is_some() && self.finish.is_none() {
            let at = down.at;
            self.begin_finish(Who::Coordinator, at);
            self.down = None;
        }
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
        let running = self.started && self.finish.is_none();
        if running && self.limits.coordinator_restarts > 0 {
            if self.restart_attempts < self.limits.coordinator_restarts {
                let due = if killed {
                    now
                } else {
                    now + self.limits.coordinator_settle
                };
                self.down = Some(Down {
                    exit,
                    at: now,
                    due,
                    attempts: 0,
                    last_error: None,
                });
                return;
            }
            if killed {
                let why = NotRestarted::NoneLeft {
                    restarts: self.restart_attempts,
                };
                self.end = Some(JobEnd::Failed(Failure::CoordinatorNotRestarted {
                    exit,
                    at: now,
                    why,
                }));
                return;
            }
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
        self.begin_finish(Who::Coordinator, now);
    }

    /// Whether the driver should start a new coordinator now (in recovery
    /// mode, on the same address, with the same secret): the attempt's
    /// number in the job, from 1.
    pub fn coordinator_restart_due(&self, now: Duration) -> Option<u32> {
        let down = self.down.as_ref()?;
        let due = self.end.is_none()
            && self.interrupted.is_none()
            && self.finish.is_none()
            && now >= down.due
            && self.restart_attempts < self.limits.coordinator_restarts;
        due.then_some(self.restart_attempts + 1)
    }

    /// The driver tried to restart the coordinator at `now`: `Ok(pid)` of
    /// the new one, listening; or why it failed.
    pub fn coordinator_restart(&mut self, outcome: Result<u32, String>, now: Duration) {
        let Some(down) = self.down.as_mut() else {
            return;
        };
        self.restart_attempts += 1;
        match outcome {
            Ok(pid) => {
                self.coordinator = Slot {
                    pid,
                    exit: None,
                    awaiting_view: false,
                    recovering: false,
                    absence: Absence::default(),
                };
                self.down = None;
            }
            Err(error) => {
                down.attempts += 1;
                down.last_error = Some(error);
                down.due = now + RESTART_BACKOFF;
            }
        }
    }

    /// Restart attempts so far in the job.
    pub fn coordinator_restarts(&self) -> u32 {
        self.restart_attempts
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
        // A newcomer gone this long with no view to say it had been admitted
        // (the coordinator is gone or mute) is taken as never admitted.
        let overdue: Vec<(usize, Exit, Duration)> = self
            .newcomers
            .iter()
            .filter(|(_, s)| !s.admitted && !s.judged)
            .filter_map(|(&n, s)| s.exit.map(|(exit, at)| (n, exit, at)))
            .filter(|&(_, _, at)| now >= at + self.limits.exit_grace)
            .collect();
        for (n, exit, at) in overdue {
            self.drop_newcomer(n, exit, at);
        }
        // A node's exit with no view to judge it by within the grace (the
        // coordinator is gone or mute) is taken as a member's.
        let unanswered = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, s)| s.awaiting_view)
            .filter_map(|(i, s)| s.exit.map(|(_, at)| (at, i)))
            .find(|&(at, _)| now >= at + self.limits.exit_grace);
        if let Some((at, i)) = unanswered {
            self.begin_finish(Who::Node(i), at);
        }
        // A killed member still in every view this long after its death:
        // the runtime did not recover (or could not tell us it did).
        if let (Some(bound), None) = (self.limits.recovery, &self.end) {
            let waited = bound + self.limits.exit_grace;
            let overdue = self
                .recovering()
                .filter(|&(_, _, _, at)| now >= at + waited)
                .min_by_key(|&(who, _, _, at)| (at, who.to_string()));
            if let Some((who, pid, exit, at)) = overdue {
                self.end = Some(JobEnd::Failed(Failure::NotRecovered {
                    who,
                    pid,
                    exit,
                    at,
                    waited,
                }));
            }
        }
        if self.end.is_none() {
            self.fence_absent(now);
            self.end = self.judge(now).map(|end| self.after_a_kill(end));
        }
        self.end.clone()
    }

    /// The verdict `end`, reached while killed members still waited for a
    /// view without them: a job whose members all exited 0 recovered (the
    /// runtime ends it with an error when it cannot), said once each; any
    /// other end of the finish has the earliest kill as its cause.
    fn after_a_kill(&mut self, end: JobEnd) -> JobEnd {
        let mut killed: Vec<(Who, u32, Exit, Duration)> = self.recovering().collect();
        if killed.is_empty() {
            return end;
        }
        killed.sort_by_key(|&(who, _, _, at)| (at, who.to_string()));
        match end {
            JobEnd::Completed {
                code: 0,
                ref disagreeing,
            } if disagreeing.is_empty() => {
                for (who, pid, exit, _) in killed {
                    self.stop_recovering(who);
                    self.recoveries += 1;
                    self.notes.push(format!(
                        "{who} (pid {pid}) {exit}; the job recovered without it and completed"
                    ));
                }
                end
            }
            JobEnd::Completed { .. }
            | JobEnd::Failed(Failure::Stragglers { .. } | Failure::Disagreement { .. }) => {
                let (who, pid, exit, at) = killed[0];
                JobEnd::Failed(Failure::NodeKilled { who, pid, exit, at })
            }
            other => other,
        }
    }

    /// Who counts as running for the finish: launch nodes and admitted
    /// newcomers that have not exited.
    fn running(&self) -> Vec<Who> {
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, s)| s.exit.is_none())
            .map(|(i, _)| Who::Node(i));
        let newcomers = self
            .newcomers
            .iter()
            .filter(|(_, s)| s.admitted && s.exit.is_none())
            .map(|(&n, _)| Who::Newcomer(n));
        nodes.chain(newcomers).collect()
    }

    fn pid_and_exit(&self, who: Who) -> (u32, Option<Exit>) {
        let slot = match who {
            Who::Node(i) => (self.nodes[i].pid, self.nodes[i].exit),
            Who::Newcomer(n) => self
                .newcomers
                .get(&n)
                .map_or((0, None), |s| (s.pid, s.exit)),
            Who::Coordinator => (self.coordinator.pid, self.coordinator.exit),
        };
        (slot.0, slot.1.map(|(e, _)| e))
    }

    fn judge(&self, now: Duration) -> Option<JobEnd> {
        if let Some(signal) = self.interrupted {
            return Some(JobEnd::Interrupted { signal });
        }
        if let Some(down) = &self.down {
            let none_left = self.restart_attempts >= self.limits.coordinator_restarts;
            if self.finish.is_none() && none_left && down.attempts > 0 {
                return Some(JobEnd::Failed(Failure::CoordinatorNotRestarted {
                    exit: down.exit,
                    at: down.at,
                    why: NotRestarted::Failed {
                        attempts: down.attempts,
                        last: down.last_error.clone().unwrap_or_default(),
                    },
                }));
            }
        }
        if let Some((first, since)) = self.finish {
            let running = self.running();
            if running.is_empty() {
                return Some(self.completion(since));
            }
            if now >= since + self.limits.exit_grace {
                let (pid, exit) = self.pid_and_exit(first);
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

    /// Every member has exited and the finish began at `since`.
    fn completion(&self, since: Duration) -> JobEnd {
        let code_of = |exit: Option<(Exit, Duration)>| exit.and_then(|(e, _)| e.code());
        let code = code_of(self.nodes[0].exit).unwrap_or(1);
        // Members that left before the finish departed in a rescale: their 0
        // is not a vote on the job's result.
        let at_finish = |exit: Option<(Exit, Duration)>| exit.is_some_and(|(_, at)| at >= since);
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, s)| (Who::Node(i), s.exit));
        let newcomers = self
            .newcomers
            .iter()
            .filter(|(_, s)| s.admitted)
            .map(|(&n, s)| (Who::Newcomer(n), s.exit));
        let disagreeing: Vec<(Who, i32)> = nodes
            .chain(newcomers)
            .filter(|&(_, exit)| at_finish(exit))
            .filter_map(|(who, exit)| code_of(exit).map(|c| (who, c)))
            .filter(|&(_, c)| c != code)
            .collect();
        // Node 0's nonzero code is the job's verdict and passes through (the
        // others typically end with a lost peer as a consequence: they are
        // named, after it). Members that disagree with a node 0 that exited
        // 0 mean something went wrong beyond the program's own choice of
        // code (a panic, a lost peer): that fails the job. So does a node 0
        // that only aborted because it lost a peer, when another member
        // ended with a code of its own (a panic, an error): the cause is
        // there, and both exits may be seen in the same look.
        let caused_elsewhere = code == EXIT_NODE_ABORTED
            && disagreeing
                .iter()
                .any(|&(_, c)| c != 0 && c != EXIT_NODE_ABORTED);
        if (code == 0 || caused_elsewhere) && !disagreeing.is_empty() {
            JobEnd::Failed(Failure::Disagreement { code, disagreeing })
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

    /// A supervisor of `n` nodes (pids 100, 101, ...) and a coordinator
    /// (pid 99) that is never restarted: the rules other than the
    /// coordinator's restarts.
    fn sup(n: usize) -> Supervisor {
        let pids: Vec<u32> = (0..n as u32).map(|i| 100 + i).collect();
        Supervisor::new(
            &pids,
            99,
            Limits {
                exit_grace: GRACE,
                timeout: None,
                launch_timeout: None,
                coordinator_restarts: 0,
                coordinator_settle: SETTLE,
                recovery: None,
            },
        )
    }

    const SETTLE: Duration = Duration::from_secs(2);

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
            Some(JobEnd::Failed(Failure::NodeKilled {
                who: Who::Node(1),
                ..
            }))
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
                coordinator_restarts: 0,
                coordinator_settle: SETTLE,
                recovery: None,
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
    fn without_restarts_the_coordinator_exiting_after_the_start_begins_the_finish() {
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
                code: 0,
                disagreeing: vec![(Who::Node(1), 2)]
            })
        );
        assert_eq!(end.exit_code(), 1);
    }

    /// A node panics; node 0 aborts because it lost that peer, and the
    /// launcher sees both exits in one look: the job failed (exit 1), it
    /// did not complete with node 0's 3.
    #[test]
    fn node_zero_aborted_by_a_lost_peer_is_not_the_verdict() {
        let mut panicked = sup(3);
        panicked.job_started();
        panicked.node_exited(0, Exit::Code(EXIT_NODE_ABORTED), s(1.0));
        panicked.node_exited(1, Exit::Code(101), s(1.0));
        panicked.node_exited(2, Exit::Code(EXIT_NODE_ABORTED), s(1.0));
        let end = panicked.poll(s(1.0)).unwrap();
        assert_eq!(end.exit_code(), 1, "{end:?}");
        let msg = end.message().unwrap();
        assert!(
            msg.starts_with(
                "node 0 exited with code 3 (it lost a peer) but node 1 exited with code 101"
            ),
            "{msg}"
        );
        // Aborts everywhere and no other cause: node 0's code passes through.
        let mut aborted = sup(2);
        aborted.job_started();
        aborted.node_exited(0, Exit::Code(EXIT_NODE_ABORTED), s(1.0));
        aborted.node_exited(1, Exit::Code(EXIT_NODE_ABORTED), s(1.0));
        assert_eq!(aborted.poll(s(1.0)).unwrap().exit_code(), EXIT_NODE_ABORTED);
    }

    #[test]
    fn a_program_refusing_its_arguments_before_the_start_is_a_usage_error() {
        let mut sup = sup(2);
        sup.node_exited(0, Exit::Code(2), s(0.1));
        sup.node_exited(1, Exit::Code(2), s(0.1));
        sup.not_started(s(0.2));
        let end = sup.poll(s(0.2)).unwrap();
        assert_eq!(end.exit_code(), 2);
        assert!(
            end.message().unwrap().contains("refused its arguments"),
            "{end:?}"
        );
    }

    #[test]
    fn a_failing_node_zeros_code_passes_through_and_the_others_are_named_after_it() {
        // `jacobi2d --grid abc`: node 0 refuses its arguments (2), node 1
        // loses its peer (3).
        let mut sup = sup(2);
        sup.job_started();
        sup.node_exited(0, Exit::Code(2), s(1.0));
        sup.node_exited(1, Exit::Code(3), s(1.0));
        let end = sup.poll(s(1.0)).unwrap();
        assert_eq!(end.exit_code(), 2, "node 0's code passes through");
        assert_eq!(
            end.message().unwrap(),
            "node 0 exited with code 2, the job's code (node 1 exited with code 3 after it; see node 0's output above for why)"
        );
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
    fn without_restarts_a_killed_coordinator_fails_the_job() {
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
                coordinator_restarts: 0,
                coordinator_settle: SETTLE,
                recovery: None,
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

    /// What happens to a job of two launch nodes (pids 100, 101) and its
    /// newcomers (pids 200, 201, ...), step by step.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        /// A newcomer with this pid is started, at 1.0 s.
        Spawn(u32),
        /// The coordinator answers, to a question asked at this time, with
        /// the view of this epoch, whose members have these pids.
        View(f64, u64, &'static [u32]),
        /// Newcomer n ends.
        NewcomerExit(usize, Exit, f64),
        /// Launch node i ends.
        NodeExit(usize, Exit, f64),
    }

    /// What `poll` says at the end, and which newcomers were dropped.
    #[derive(Debug)]
    enum Want {
        Running,
        Completed(i32),
        Interrupted(i32),
        /// A failure whose message starts like this.
        Failed(&'static str),
    }

    const LAUNCH: &[u32] = &[100, 101];
    const ADMITTED_200: &[u32] = &[100, 101, 200];

    fn play(steps: &[Step]) -> Supervisor {
        let mut sup = sup(2);
        sup.members_seen(s(0.5), 1, LAUNCH);
        for step in steps {
            match *step {
                Step::Spawn(pid) => {
                    sup.newcomer_spawned(pid, s(1.0));
                }
                Step::View(asked_at, epoch, pids) => sup.members_seen(s(asked_at), epoch, pids),
                Step::NewcomerExit(n, exit, at) => sup.newcomer_exited(n, exit, s(at)),
                Step::NodeExit(i, exit, at) => sup.node_exited(i, exit, s(at)),
            }
        }
        sup
    }

    /// A scenario: its name, its steps, when to poll, the verdict wanted
    /// then, and the newcomers dropped (number, surely never admitted).
    type Case = (
        &'static str,
        &'static [Step],
        f64,
        Want,
        &'static [(usize, bool)],
    );

    /// Issue 15's fault test: a departing node cut off after its hand-over
    /// never hears that the commit removed it and exits with an error code
    /// (3) seconds later. The view after its exit no longer lists it: the
    /// job goes on, and the exit is said once.
    #[test]
    fn a_node_removed_by_a_rescale_that_exits_with_an_error_code_does_not_end_the_job() {
        let mut sup = sup(4);
        sup.members_seen(s(0.5), 1, &[100, 101, 102, 103]);
        sup.node_exited(3, Exit::Code(3), s(2.0));
        assert!(sup.wants_views(), "its exit waits for a view");
        assert_eq!(sup.poll(s(2.05)), None);
        // A view asked for before the exit does not decide.
        sup.members_seen(s(1.9), 2, &[100, 101, 102]);
        assert!(sup.take_notes().is_empty());
        sup.members_seen(s(2.1), 2, &[100, 101, 102]);
        let notes = sup.take_notes();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0]
                .starts_with("node 3 (pid 103) exited with code 3 after a rescale had removed it"),
            "{notes:?}"
        );
        assert!(!sup.wants_views());
        assert_eq!(sup.poll(s(60.0)), None, "the job goes on without it");
        // The job then ends normally: the removed node's code is no vote.
        for i in 0..3 {
            sup.node_exited(i, Exit::Code(0), s(61.0));
        }
        sup.coordinator_exited(Exit::Code(0), s(61.0));
        assert!(
            matches!(sup.poll(s(61.1)), Some(JobEnd::Completed { code: 0, .. })),
            "{:?}",
            sup.poll(s(61.1))
        );
    }

    /// A member that fails with a code (not a signal) is judged by the view
    /// after its exit, which still lists it: the finish begins at its exit,
    /// and without a view at all it begins after the grace all the same.
    #[test]
    fn a_member_exiting_with_an_error_code_ends_the_job_with_or_without_a_view() {
        let mut v = sup(3);
        v.members_seen(s(0.5), 1, &[100, 101, 102]);
        v.node_exited(2, Exit::Code(101), s(2.0));
        v.members_seen(s(2.1), 1, &[100, 101, 102]);
        assert!(v.take_notes().is_empty());
        assert_eq!(
            v.poll(s(2.0) + GRACE - s(0.1)),
            None,
            "the others have the grace"
        );
        match v.poll(s(2.0) + GRACE) {
            Some(JobEnd::Failed(Failure::Stragglers { first, at, .. })) => {
                assert_eq!((first, at), (Who::Node(2), s(2.0)));
            }
            other => panic!("{other:?}"),
        }

        let mut v = sup(3);
        v.members_seen(s(0.5), 1, &[100, 101, 102]);
        v.node_exited(2, Exit::Code(101), s(2.0));
        assert_eq!(v.poll(s(2.0) + GRACE - s(0.1)), None);
        match v.poll(s(2.0) + GRACE) {
            Some(JobEnd::Failed(Failure::Stragglers { first, at, .. })) => {
                assert_eq!((first, at), (Who::Node(2), s(2.0)));
            }
            other => panic!("{other:?}"),
        }

        // Node 0 aborting at once after it (it lost a peer) does not hide
        // it: the finish begins with the earlier exit, whose code is named.
        let mut v = sup(3);
        v.members_seen(s(0.5), 1, &[100, 101, 102]);
        v.node_exited(2, Exit::Code(101), s(2.0));
        v.node_exited(0, Exit::Code(EXIT_NODE_ABORTED), s(2.01));
        v.node_exited(1, Exit::Code(EXIT_NODE_ABORTED), s(2.01));
        v.coordinator_exited(Exit::Code(EXIT_NODE_ABORTED), s(2.02));
        match v.poll(s(2.1)) {
            Some(JobEnd::Failed(Failure::Disagreement { disagreeing, .. })) => {
                assert!(
                    disagreeing.contains(&(Who::Node(2), 101)),
                    "{disagreeing:?}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// Issue 15, item 3: the launcher's first look after it started a
    /// newcomer comes after two commits, one that admitted it and one that
    /// removed it (it exited 0). The view does not list it; the admission
    /// history does: it is recorded as admitted, not dropped, and the job
    /// goes on.
    #[test]
    fn a_newcomer_admitted_and_removed_between_two_looks_is_recorded_as_admitted() {
        let mut sup = sup(2);
        sup.members_seen(s(0.5), 1, LAUNCH);
        let n = sup.newcomer_spawned(200, s(1.0));
        sup.newcomer_exited(n, Exit::Code(0), s(2.0));
        // Asked at 2.1: the view of epoch 3 (admitted at 2, removed at 3).
        sup.admissions_seen(&[(2, 200)]);
        sup.members_seen(s(2.1), 3, LAUNCH);
        assert!(sup.newcomer_admitted(n), "the history says it was admitted");
        assert_eq!(sup.take_dropped(), vec![], "not dropped");
        assert_eq!(sup.poll(s(60.0)), None, "a departure: the job goes on");
        assert!(!sup.wants_views(), "nothing left to settle");

        // The same look without the history (an older coordinator): it is
        // not admitted, and not called surely never admitted either, since
        // the epoch moved by two since it was started.
        let mut sup = sup_with_view();
        let n = sup.newcomer_spawned(200, s(1.0));
        sup.newcomer_exited(n, Exit::Code(0), s(2.0));
        sup.members_seen(s(2.1), 3, LAUNCH);
        assert!(!sup.newcomer_admitted(n));
        let dropped: Vec<(usize, bool)> = sup
            .take_dropped()
            .iter()
            .map(|d| (d.newcomer, d.never_admitted))
            .collect();
        assert_eq!(dropped, vec![(n, false)]);
    }

    fn sup_with_view() -> Supervisor {
        let mut sup = sup(2);
        sup.members_seen(s(0.5), 1, LAUNCH);
        sup
    }

    /// The history's entries that cannot be this newcomer's are ignored: an
    /// admission of its pid in an epoch seen before it started (a reused
    /// pid), another pid. It stays a newcomer; exiting unadmitted, it is
    /// dropped. A newcomer the history lists that then dies by a signal is
    /// judged as a member: the job fails.
    #[test]
    fn admissions_of_other_processes_do_not_admit_a_newcomer() {
        let mut sup = sup(2);
        sup.members_seen(s(0.5), 1, LAUNCH);
        sup.members_seen(s(0.7), 2, LAUNCH);
        let n = sup.newcomer_spawned(200, s(1.0));
        sup.admissions_seen(&[(2, 200), (3, 201)]);
        assert!(!sup.newcomer_admitted(n));
        sup.newcomer_exited(n, Exit::Code(3), s(2.0));
        sup.admissions_seen(&[(2, 200), (3, 201)]);
        sup.members_seen(s(2.1), 3, &[100, 101, 201]);
        let dropped = sup.take_dropped();
        assert_eq!(dropped.len(), 1);
        assert!(dropped[0].never_admitted, "{}", dropped[0]);

        let mut sup = sup_with_view();
        let n = sup.newcomer_spawned(300, s(1.0));
        sup.admissions_seen(&[(2, 300)]);
        assert!(sup.newcomer_admitted(n));
        sup.newcomer_exited(n, KILL, s(3.0));
        assert!(
            matches!(
                sup.poll(s(3.1)),
                Some(JobEnd::Failed(Failure::NodeKilled { .. }))
            ),
            "an admitted newcomer killed is a member killed"
        );
    }

    #[test]
    fn newcomer_rules() {
        use Step::*;
        let table: &[Case] = &[
            (
                "a newcomer that exits before it is admitted is dropped",
                &[Spawn(200), NewcomerExit(0, Exit::Code(3), 2.0), View(2.1, 1, LAUNCH)],
                50.0,
                Want::Running,
                &[(0, true)],
            ),
            (
                "so is one killed before it is admitted",
                &[Spawn(200), NewcomerExit(0, KILL, 2.0), View(2.1, 1, LAUNCH)],
                50.0,
                Want::Running,
                &[(0, true)],
            ),
            (
                "an answer to a question asked before the exit settles nothing",
                &[Spawn(200), NewcomerExit(0, Exit::Code(3), 2.0), View(1.9, 1, LAUNCH)],
                2.1,
                Want::Running,
                &[],
            ),
            (
                "without any answer it is dropped after the grace period",
                &[Spawn(200), NewcomerExit(0, Exit::Code(3), 2.0)],
                12.0,
                Want::Running,
                &[(0, false)],
            ),
            (
                "followed through every epoch and never a member: surely dropped",
                &[
                    Spawn(200),
                    View(1.5, 1, LAUNCH),
                    View(1.7, 2, &[100]),
                    NewcomerExit(0, Exit::Code(3), 2.0),
                    View(2.1, 2, &[100]),
                ],
                50.0,
                Want::Running,
                &[(0, true)],
            ),
            (
                "the epoch jumped while it was followed: admitted and removed unseen, maybe",
                &[
                    Spawn(200),
                    View(1.5, 1, LAUNCH),
                    NewcomerExit(0, Exit::Code(0), 2.0),
                    View(2.1, 3, LAUNCH),
                ],
                50.0,
                Want::Running,
                &[(0, false)],
            ),
            (
                "a view asked for before its start says nothing about it",
                &[Spawn(200), NewcomerExit(0, Exit::Code(3), 2.0), View(0.9, 1, LAUNCH)],
                2.1,
                Want::Running,
                &[],
            ),
            (
                "an admitted newcomer killed by a signal fails the job",
                &[Spawn(200), View(2.0, 2, ADMITTED_200), NewcomerExit(0, KILL, 3.0)],
                3.0,
                Want::Failed("newcomer 0 (pid 200) was killed by signal 9 (SIGKILL) at 3.0s; stopping the job"),
                &[],
            ),
            (
                "a newcomer still in the view after its exit died as a member",
                &[Spawn(200), NewcomerExit(0, KILL, 3.0), View(3.1, 2, ADMITTED_200)],
                3.1,
                Want::Failed("newcomer 0 (pid 200) was killed by signal 9 (SIGKILL) at 3.0s"),
                &[],
            ),
            (
                "an admitted newcomer exiting 0 alone departed in a rescale",
                &[Spawn(200), View(2.0, 2, ADMITTED_200), NewcomerExit(0, Exit::Code(0), 3.0), View(3.1, 3, LAUNCH)],
                100.0,
                Want::Running,
                &[],
            ),
            (
                "a launch node removed by a rescale exits 0: the job goes on",
                &[Spawn(200), View(2.0, 2, ADMITTED_200), NodeExit(1, Exit::Code(0), 3.0)],
                100.0,
                Want::Running,
                &[],
            ),
            (
                "an admitted newcomer's nonzero exit begins the finish",
                &[Spawn(200), View(2.0, 2, ADMITTED_200), NewcomerExit(0, Exit::Code(4), 3.0)],
                13.0,
                Want::Failed("newcomer 0 (pid 200) exited with code 4 at 3.0s, but nodes 0, 1 kept running for 10.0s more"),
                &[],
            ),
            (
                "the job completes without waiting for newcomers never admitted",
                &[
                    Spawn(200),
                    NodeExit(0, Exit::Code(0), 5.0),
                    NodeExit(1, Exit::Code(0), 5.0),
                ],
                5.0,
                Want::Completed(0),
                &[],
            ),
            (
                "but not without its admitted ones",
                &[
                    Spawn(200),
                    Spawn(201),
                    View(2.0, 2, ADMITTED_200),
                    NodeExit(0, Exit::Code(0), 5.0),
                    NodeExit(1, Exit::Code(0), 5.0),
                ],
                15.0,
                Want::Failed("node 0 (pid 100) exited with code 0 at 5.0s, but newcomer 0 kept running for 10.0s more"),
                &[],
            ),
            (
                "an admitted newcomer ending with the others completes the job",
                &[
                    Spawn(200),
                    View(2.0, 2, ADMITTED_200),
                    NodeExit(0, Exit::Code(0), 5.0),
                    NodeExit(1, Exit::Code(0), 5.0),
                    NewcomerExit(0, Exit::Code(0), 5.1),
                ],
                5.1,
                Want::Completed(0),
                &[],
            ),
            (
                "an admitted newcomer disagreeing with node 0 fails the job",
                &[
                    Spawn(200),
                    View(2.0, 2, ADMITTED_200),
                    NodeExit(0, Exit::Code(0), 5.0),
                    NodeExit(1, Exit::Code(0), 5.0),
                    NewcomerExit(0, Exit::Code(2), 5.1),
                ],
                5.1,
                Want::Failed("node 0 exited with code 0 but newcomer 0 exited with code 2"),
                &[],
            ),
        ];
        for (name, steps, at, want, dropped) in table {
            let mut sup = play(steps);
            let end = sup.poll(s(*at));
            match (want, &end) {
                (Want::Running, None) => {}
                (Want::Completed(code), Some(JobEnd::Completed { code: c, .. })) if c == code => {}
                (Want::Failed(start), Some(end @ JobEnd::Failed(_))) => {
                    let msg = end.message().unwrap();
                    assert!(msg.starts_with(start), "{name}: {msg}");
                }
                _ => panic!("{name}: wanted {want:?}, got {end:?}"),
            }
            let got: Vec<(usize, bool)> = sup
                .take_dropped()
                .iter()
                .map(|d| (d.newcomer, d.never_admitted))
                .collect();
            assert_eq!(got, *dropped, "{name}: dropped newcomers");
        }
    }

    #[test]
    fn a_dropped_newcomer_is_told_once_with_its_pid_and_exit() {
        let mut sup = play(&[
            Step::Spawn(200),
            Step::Spawn(201),
            Step::NewcomerExit(1, Exit::Code(3), 2.0),
            Step::View(2.5, 1, LAUNCH),
        ]);
        let dropped = sup.take_dropped();
        assert_eq!(dropped.len(), 1);
        assert_eq!(
            dropped[0].to_string(),
            "newcomer 1 (pid 201) exited with code 3 at 2.0s before it was admitted; dropped (the job goes on)"
        );
        let unsure = Dropped {
            never_admitted: false,
            ..dropped[0]
        };
        assert_eq!(
            unsure.to_string(),
            "newcomer 1 (pid 201) exited with code 3 at 2.0s, not a member of the job (never admitted, or admitted and removed between two looks); the job goes on"
        );
        sup.members_seen(s(3.0), 1, LAUNCH);
        assert_eq!(sup.poll(s(30.0)), None);
        assert!(sup.take_dropped().is_empty(), "told twice");
        assert!(!sup.newcomer_admitted(1));
    }

    #[test]
    fn newcomers_are_followed_until_admitted_and_only_waiting_ones_may_be_stopped() {
        let mut sup = sup(2);
        assert!(sup.wants_views(), "before the start");
        sup.members_seen(s(0.5), 1, LAUNCH);
        assert!(!sup.wants_views(), "nothing to follow");
        let n = sup.newcomer_spawned(200, s(0.6));
        assert_eq!(n, 0);
        assert!(sup.wants_views(), "a newcomer waits");
        assert!(sup.newcomer_waiting(0));
        sup.members_seen(s(1.0), 2, ADMITTED_200);
        assert!(sup.newcomer_admitted(0));
        assert!(
            !sup.newcomer_waiting(0),
            "a member is not stopped as a newcomer"
        );
        assert!(!sup.wants_views());
        assert!(!sup.newcomer_waiting(7), "unknown newcomer");
    }

    /// Issue 15, item 6: a job that admits and removes newcomers for
    /// thousands of rescales, with drops among them. The supervisor holds
    /// only the newcomers not judged yet (here the one that waits all
    /// along); those let go count as settled, and the verdict is what it
    /// would have been with all of them kept.
    #[test]
    fn settled_newcomers_are_let_go_so_what_is_held_stays_bounded() {
        let mut sup = sup(2);
        sup.members_seen(s(0.5), 1, LAUNCH);
        let waiting = sup.newcomer_spawned(99_999, s(0.6));
        let (mut epoch, mut t, mut most, mut dropped) = (1, 1.0, 0, 0);
        for k in 0..5_000u32 {
            let pid = 10_000 + k;
            let n = sup.newcomer_spawned(pid, s(t));
            epoch += 1;
            t += 0.01;
            sup.members_seen(s(t), epoch, &[100, 101, pid]);
            epoch += 1;
            t += 0.01;
            sup.members_seen(s(t), epoch, LAUNCH);
            sup.newcomer_exited(n, Exit::Code(0), s(t));
            if k % 10 == 0 {
                let d = sup.newcomer_spawned(pid + 100_000, s(t));
                sup.newcomer_exited(d, Exit::Code(3), s(t + 0.001));
                t += 0.01;
                sup.members_seen(s(t), epoch, LAUNCH);
                dropped += sup.take_dropped().len();
            }
            assert_eq!(sup.poll(s(t)), None, "rescale {k}");
            most = most.max(sup.newcomers_held());
            sup.forget_settled();
            assert!(sup.newcomer_settled(n), "a departed newcomer let go is settled");
            assert!(!sup.holds_newcomer(n));
        }
        assert!(most <= 3, "held {most} newcomers at once");
        assert_eq!(sup.newcomers_held(), 1, "only the waiting newcomer is held");
        assert!(sup.newcomer_waiting(waiting) && !sup.newcomer_settled(waiting));
        assert_eq!(dropped, 500, "every drop was told");
        assert!(sup.wants_views(), "the waiting newcomer is still followed");
        // The job ends as it would have: node 0 and node 1 exit 0; the
        // newcomer never admitted is not waited for.
        sup.node_exited(0, Exit::Code(0), s(t + 1.0));
        sup.node_exited(1, Exit::Code(0), s(t + 1.1));
        assert!(
            matches!(
                sup.poll(s(t + 1.2)),
                Some(JobEnd::Completed { code: 0, ref disagreeing }) if disagreeing.is_empty()
            ),
            "{:?}",
            sup.poll(s(t + 1.2))
        );
    }

    /// While the job finishes, every member's exit weighs on the verdict:
    /// nothing is let go then.
    #[test]
    fn nothing_is_let_go_while_the_job_finishes() {
        let mut sup = sup(2);
        sup.members_seen(s(0.5), 1, LAUNCH);
        let n = sup.newcomer_spawned(200, s(0.6));
        sup.members_seen(s(1.0), 2, ADMITTED_200);
        sup.node_exited(0, Exit::Code(0), s(2.0));
        sup.newcomer_exited(n, Exit::Code(0), s(2.1));
        assert!(sup.newcomer_settled(n));
        assert!(sup.forget_settled().is_empty(), "let go while finishing");
        assert!(sup.holds_newcomer(n));
        sup.node_exited(1, Exit::Code(0), s(2.2));
        assert!(matches!(
            sup.poll(s(2.3)),
            Some(JobEnd::Completed { code: 0, .. })
        ));
    }

    #[test]
    fn newcomers_are_refused_once_the_job_is_ending() {
        let mut sup = sup(2);
        sup.members_seen(s(0.5), 1, LAUNCH);
        assert_eq!(sup.accepts_newcomers(), Ok(()));
        sup.node_exited(0, Exit::Code(0), s(1.0));
        assert_eq!(sup.accepts_newcomers(), Err("the job is ending".to_owned()));

        let mut sup = sup_started(2);
        sup.interrupt(15);
        assert_eq!(
            sup.accepts_newcomers(),
            Err("the launcher received SIGTERM and is stopping the job".to_owned())
        );
    }

    /// What happens to a job of two launch nodes (pids 100, 101) whose
    /// coordinator (pid 99) may be restarted twice, with a 2 s settle period.
    #[derive(Clone, Copy, Debug)]
    enum Coord {
        /// The coordinator shows the launch view, asked at 0.5 s.
        Start,
        /// The coordinator ends.
        Gone(Exit, f64),
        /// The driver's restart attempt: the new pid, or why it failed.
        Restart(Result<u32, &'static str>, f64),
        /// Launch node i ends.
        Node(usize, Exit, f64),
        /// The launcher gets this signal.
        Interrupt(i32),
    }

    /// A scenario: its name, its steps, when to look, the verdict wanted
    /// then, and the restart attempt due then (its number), if any.
    type CoordCase = (&'static str, &'static [Coord], f64, Want, Option<u32>);

    #[test]
    fn coordinator_rules() {
        use Coord::*;
        const OK: Exit = Exit::Code(0);
        let table: &[CoordCase] = &[
            (
                "a coordinator killed while the job runs is restarted at once",
                &[Start, Gone(KILL, 2.0)],
                2.0,
                Want::Running,
                Some(1),
            ),
            (
                "restarted, the job goes on and completes",
                &[Start, Gone(KILL, 2.0), Restart(Ok(98), 2.1), Node(0, OK, 5.0), Node(1, OK, 5.0)],
                5.0,
                Want::Completed(0),
                None,
            ),
            (
                "one exiting with a code waits the settle period...",
                &[Start, Gone(Exit::Code(101), 2.0)],
                3.9,
                Want::Running,
                None,
            ),
            (
                "...then it is restarted",
                &[Start, Gone(Exit::Code(101), 2.0)],
                4.0,
                Want::Running,
                Some(1),
            ),
            (
                "members exiting within the settle period: the shutdown barrier ended",
                &[Start, Gone(Exit::Code(7), 2.0), Node(0, Exit::Code(7), 2.1), Node(1, Exit::Code(7), 2.1)],
                2.1,
                Want::Completed(7),
                None,
            ),
            (
                "that finish still waits for every member",
                &[Start, Gone(OK, 2.0), Node(0, OK, 2.1)],
                12.0,
                Want::Failed("the coordinator (pid 99) exited with code 0 at 2.0s, but node 1 kept running for 10.0s more"),
                None,
            ),
            (
                "a failed attempt is tried again after the backoff...",
                &[Start, Gone(KILL, 2.0), Restart(Err("address in use"), 2.0)],
                2.4,
                Want::Running,
                None,
            ),
            (
                "...as the second attempt",
                &[Start, Gone(KILL, 2.0), Restart(Err("address in use"), 2.0)],
                2.5,
                Want::Running,
                Some(2),
            ),
            (
                "every attempt failed: the job fails with the last error",
                &[Start, Gone(KILL, 2.0), Restart(Err("no address"), 2.0), Restart(Err("address in use"), 2.5)],
                2.5,
                Want::Failed("the coordinator was killed by signal 9 (SIGKILL) at 2.0s while the job was running and was not restarted: 2 attempts failed, the last: address in use; stopping the job"),
                None,
            ),
            (
                "a restarted coordinator killed again is restarted again",
                &[Start, Gone(KILL, 2.0), Restart(Ok(98), 2.1), Gone(KILL, 3.0)],
                3.0,
                Want::Running,
                Some(2),
            ),
            (
                "restarts used up: the next kill fails the job",
                &[Start, Gone(KILL, 2.0), Restart(Ok(98), 2.1), Gone(KILL, 3.0), Restart(Ok(97), 3.1), Gone(KILL, 4.0)],
                4.0,
                Want::Failed("the coordinator was killed by signal 9 (SIGKILL) at 4.0s while the job was running and was not restarted: it had been restarted 2 times already, the most allowed"),
                None,
            ),
            (
                "restarts used up: an exit begins the finish, naming the latest coordinator",
                &[Start, Gone(KILL, 2.0), Restart(Ok(98), 2.1), Gone(KILL, 3.0), Restart(Ok(97), 3.1), Gone(OK, 4.0)],
                14.0,
                Want::Failed("the coordinator (pid 97) exited with code 0 at 4.0s, but nodes 0, 1 kept running"),
                None,
            ),
            (
                "never restarted before the start",
                &[Gone(KILL, 2.0)],
                2.0,
                Want::Failed("the coordinator was killed by signal 9 (SIGKILL) at 2.0s before the job started"),
                None,
            ),
            (
                "never restarted once the finish has begun",
                &[Start, Node(0, OK, 2.0), Gone(KILL, 2.1)],
                2.1,
                Want::Failed("the coordinator was killed by signal 9 (SIGKILL) at 2.1s while the job was running"),
                None,
            ),
            (
                "a finish that begins while it is down stops the restarts",
                &[Start, Gone(KILL, 2.0), Restart(Err("address in use"), 2.0), Node(1, Exit::Code(3), 2.2)],
                2.5,
                Want::Running,
                None,
            ),
            (
                "an interrupt stops the restarts",
                &[Start, Gone(KILL, 2.0), Interrupt(15)],
                2.0,
                Want::Interrupted(15),
                None,
            ),
        ];
        for (name, steps, at, want, due) in table {
            let mut sup = Supervisor::new(
                &[100, 101],
                99,
                Limits {
                    exit_grace: GRACE,
                    timeout: None,
                    launch_timeout: Some(s(60.0)),
                    coordinator_restarts: 2,
                    coordinator_settle: SETTLE,
                    recovery: None,
                },
            );
            for step in *steps {
                match *step {
                    Start => sup.members_seen(s(0.5), 1, LAUNCH),
                    Gone(exit, at) => sup.coordinator_exited(exit, s(at)),
                    Restart(outcome, at) => {
                        assert!(
                            sup.coordinator_restart_due(s(at)).is_some(),
                            "{name}: restarting at {at} when none is due"
                        );
                        sup.coordinator_restart(outcome.map_err(str::to_owned), s(at));
                    }
                    Node(i, exit, at) => sup.node_exited(i, exit, s(at)),
                    Interrupt(signal) => sup.interrupt(signal),
                }
            }
            assert_eq!(
                sup.coordinator_restart_due(s(*at)),
                *due,
                "{name}: restart due"
            );
            let end = sup.poll(s(*at));
            match (want, &end) {
                (Want::Running, None) => {}
                (Want::Completed(code), Some(JobEnd::Completed { code: c, .. })) if c == code => {}
                (Want::Interrupted(signal), Some(JobEnd::Interrupted { signal: got }))
                    if got == signal => {}
                (Want::Failed(start), Some(end @ JobEnd::Failed(_))) => {
                    let msg = end.message().unwrap();
                    assert!(msg.starts_with(start), "{name}: {msg}");
                }
                _ => panic!("{name}: wanted {want:?}, got {end:?}"),
            }
        }
    }

    #[test]
    fn restarts_are_counted_whatever_their_outcome() {
        let mut sup = Supervisor::new(
            &[100],
            99,
            Limits {
                exit_grace: GRACE,
                timeout: None,
                launch_timeout: None,
                coordinator_restarts: 3,
                coordinator_settle: SETTLE,
                recovery: None,
            },
        );
        sup.job_started();
        assert_eq!(sup.coordinator_restarts(), 0);
        sup.coordinator_exited(KILL, s(1.0));
        sup.coordinator_restart(Err("no address".into()), s(1.0));
        assert_eq!(sup.coordinator_restarts(), 1);
        sup.coordinator_restart(Ok(98), s(1.5));
        assert_eq!(sup.coordinator_restarts(), 2);
        assert_eq!(sup.coordinator_restart_due(s(100.0)), None, "back up");
        // A report with nothing down changes nothing.
        sup.coordinator_restart(Ok(97), s(2.0));
        assert_eq!(sup.coordinator_restarts(), 2);
        // The new coordinator is the one judged: its exit ends the job normally.
        sup.node_exited(0, Exit::Code(0), s(3.0));
        sup.coordinator_exited(Exit::Code(0), s(3.0));
        assert_eq!(
            sup.poll(s(3.0)),
            Some(JobEnd::Completed {
                code: 0,
                disagreeing: vec![]
            })
        );
    }

    fn sup_started(n: usize) -> Supervisor {
        let mut sup = sup(n);
        sup.job_started();
        sup
    }

    /// The runtime's recovery bound the fault-tolerance tests run with.
    const RECOVERY: Duration = Duration::from_secs(30);

    /// `sup(n)` for a job that runs with `+ft-every`, seen started with
    /// every launch node in the view of epoch 1.
    fn sup_ft(n: usize) -> Supervisor {
        let pids: Vec<u32> = (0..n as u32).map(|i| 100 + i).collect();
        let mut sup = Supervisor::new(
            &pids,
            99,
            Limits {
                exit_grace: GRACE,
                timeout: None,
                launch_timeout: None,
                coordinator_restarts: 0,
                coordinator_settle: SETTLE,
                recovery: Some(RECOVERY),
            },
        );
        sup.members_seen(s(0.5), 1, &pids);
        sup
    }

    fn end_normally(sup: &mut Supervisor, nodes: &[usize], at: f64) -> Option<JobEnd> {
        for &i in nodes {
            sup.node_exited(i, Exit::Code(0), s(at));
        }
        sup.coordinator_exited(Exit::Code(0), s(at));
        sup.poll(s(at + 0.1))
    }

    /// Issue 20: with fault tolerance, a node other than 0 killed without
    /// notice is judged by the views after its death. One that still lists
    /// it is no verdict (the recovery's commit takes time); the first one
    /// without it says the job recovered, once, and the job goes on to end
    /// normally.
    #[test]
    fn with_fault_tolerance_a_killed_node_the_view_drops_is_a_recovery() {
        let mut sup = sup_ft(4);
        sup.node_exited(2, KILL, s(3.0));
        assert_eq!(sup.poll(s(3.0)), None, "a kill is not a verdict yet");
        assert!(sup.wants_views(), "its recovery waits for a view");
        // Asked before the kill: says nothing about it.
        sup.members_seen(s(2.9), 2, &[100, 101, 103]);
        assert!(sup.take_notes().is_empty());
        // Asked after, still listing it: the recovery has not committed.
        sup.members_seen(s(3.1), 1, &[100, 101, 102, 103]);
        assert!(sup.take_notes().is_empty());
        assert_eq!(sup.poll(s(3.0) + RECOVERY), None, "within the bound");
        sup.members_seen(s(3.4), 2, &[100, 101, 103]);
        assert_eq!(
            sup.take_notes(),
            vec!["node 2 (pid 102) was killed by signal 9 (SIGKILL); the job recovered without it"]
        );
        assert_eq!(sup.recoveries(), 1);
        assert!(!sup.wants_views());
        sup.members_seen(s(3.6), 2, &[100, 101, 103]);
        assert!(sup.take_notes().is_empty(), "said once");
        assert_eq!(sup.poll(s(3.0) + RECOVERY + GRACE + s(60.0)), None);
        assert_eq!(
            end_normally(&mut sup, &[0, 1, 3], 200.0),
            Some(JobEnd::Completed {
                code: 0,
                disagreeing: vec![]
            })
        );
    }

    /// A member that runs on after the views dropped it (a hung node the
    /// coordinator declared lost: stopped, it cannot exit) is fenced once
    /// it outlasts the grace, with or without fault tolerance; its end is
    /// reported, never judged, and the job completes without it.
    #[test]
    fn a_member_the_views_dropped_while_it_runs_is_fenced_after_the_grace() {
        for mut sup in [sup(3), sup_ft(3)] {
            sup.members_seen(s(0.5), 1, &[100, 101, 102]);
            sup.members_seen(s(5.0), 2, &[100, 101]);
            assert_eq!(sup.poll(s(5.0) + GRACE - s(0.1)), None);
            assert!(sup.take_fenced().is_empty(), "not within the grace");
            assert_eq!(sup.poll(s(5.0) + GRACE), None);
            assert_eq!(sup.take_fenced(), vec![(Who::Node(2), 102)]);
            assert_eq!(
                sup.take_notes(),
                vec!["node 2 (pid 102) still runs 10.0s after a view without it (at 5.0s): the job no longer counts on it (declared lost, or removed by a rescale); killing it"]
            );
            assert_eq!(sup.poll(s(30.0)), None);
            assert!(sup.take_fenced().is_empty(), "fenced once");
            sup.node_exited(2, KILL, s(30.0));
            assert_eq!(sup.poll(s(30.1)), None, "its kill is not judged");
            assert_eq!(
                sup.take_notes(),
                vec!["node 2 (pid 102), fenced, was killed by signal 9 (SIGKILL)"]
            );
            assert_eq!(
                end_normally(&mut sup, &[0, 1], 40.0),
                Some(JobEnd::Completed {
                    code: 0,
                    disagreeing: vec![]
                })
            );
            assert_eq!(sup.recoveries(), 0);
        }
    }

    /// A hung node that outlasts the start of the finish is fenced, not
    /// waited for: the job completes once it is gone.
    #[test]
    fn a_dropped_member_does_not_hold_up_the_finish() {
        let mut sup = sup_ft(3);
        sup.members_seen(s(5.0), 2, &[100, 101]);
        sup.node_exited(0, Exit::Code(0), s(8.0));
        sup.node_exited(1, Exit::Code(0), s(8.0));
        sup.coordinator_exited(Exit::Code(0), s(8.0));
        assert_eq!(sup.poll(s(5.0) + GRACE), None);
        assert_eq!(sup.take_fenced(), vec![(Who::Node(2), 102)]);
        sup.node_exited(2, KILL, s(15.1));
        assert_eq!(
            sup.poll(s(15.2)),
            Some(JobEnd::Completed {
                code: 0,
                disagreeing: vec![]
            })
        );
    }

    /// Not fenced: a departing node that exits within the grace, a member
    /// a later view lists again, node 0, and a newcomer never admitted.
    /// An admitted newcomer is fenced like a launch node.
    #[test]
    fn only_members_that_outlast_the_grace_outside_the_views_are_fenced() {
        let mut sup = sup_ft(4);
        let waiting = sup.newcomer_spawned(200, s(1.0));
        let admitted = sup.newcomer_spawned(201, s(1.0));
        sup.members_seen(s(2.0), 2, &[101, 102, 103, 201]);
        assert!(sup.newcomer_admitted(admitted));
        sup.members_seen(s(3.0), 3, &[102, 103]);
        sup.node_exited(1, Exit::Code(0), s(3.1));
        sup.members_seen(s(4.0), 3, &[102, 103, 201]);
        assert_eq!(sup.poll(s(60.0)), None);
        assert!(sup.take_fenced().is_empty(), "{:?}", sup.take_notes());
        sup.members_seen(s(61.0), 4, &[102, 103]);
        assert_eq!(sup.poll(s(61.0) + GRACE), None);
        assert_eq!(sup.take_fenced(), vec![(Who::Newcomer(admitted), 201)]);
        sup.newcomer_exited(admitted, KILL, s(71.1));
        assert_eq!(sup.poll(s(71.2)), None, "its kill is not judged");
        assert!(sup.newcomer_settled(admitted));
        assert!(!sup.newcomer_settled(waiting));
    }

    /// The probe asks for the view, then for the admission history: a
    /// commit between the two lists the newcomer as admitted beside a view
    /// that predates it. That view's not listing it is no absence (it was
    /// once: the newcomer was fenced 10 s after its admission, and the job
    /// ended on the loss, when no later view came to clear it).
    #[test]
    fn a_view_older_than_a_newcomers_admission_does_not_count_it_absent() {
        for mut sup in [sup(2), sup_ft(2)] {
            sup.members_seen(s(0.1), 3, &[100, 101]);
            let n = sup.newcomer_spawned(201, s(0.2));
            sup.admissions_seen(&[(4, 201)]);
            sup.members_seen(s(0.3), 3, &[100, 101]);
            assert!(sup.newcomer_admitted(n));
            assert_eq!(sup.poll(s(0.3) + GRACE + s(5.0)), None);
            assert!(sup.take_fenced().is_empty(), "{:?}", sup.take_notes());
            // A view of its epoch or later that drops it still counts.
            sup.members_seen(s(20.0), 5, &[100, 101]);
            assert_eq!(sup.poll(s(20.0) + GRACE), None);
            assert_eq!(sup.take_fenced(), vec![(Who::Newcomer(n), 201)]);
        }
    }

    /// A killed node that every view still lists past the recovery bound
    /// plus the grace fails the job, naming it; not a moment before.
    #[test]
    fn with_fault_tolerance_a_killed_node_still_in_the_view_fails_the_job_after_the_bound() {
        let mut sup = sup_ft(3);
        sup.node_exited(1, KILL, s(5.0));
        for k in 1..40 {
            sup.members_seen(s(5.0 + f64::from(k)), 1, &[100, 101, 102]);
        }
        assert_eq!(sup.poll(s(5.0) + RECOVERY + GRACE - s(0.1)), None);
        let end = sup.poll(s(5.0) + RECOVERY + GRACE).unwrap();
        assert_eq!(
            end,
            JobEnd::Failed(Failure::NotRecovered {
                who: Who::Node(1),
                pid: 101,
                exit: KILL,
                at: s(5.0),
                waited: RECOVERY + GRACE,
            })
        );
        assert_eq!(end.exit_code(), 1);
        assert!(
            end.message()
                .unwrap()
                .starts_with("node 1 (pid 101) was killed by signal 9 (SIGKILL) at 5.0s and the job did not recover"),
            "{end:?}"
        );
        // Without any view at all, the same bound.
        let mut sup = sup_ft(3);
        sup.node_exited(1, KILL, s(5.0));
        assert_eq!(sup.poll(s(5.0) + RECOVERY + GRACE - s(0.1)), None);
        assert!(matches!(
            sup.poll(s(5.0) + RECOVERY + GRACE),
            Some(JobEnd::Failed(Failure::NotRecovered {
                who: Who::Node(1),
                ..
            }))
        ));
    }

    /// What fault tolerance does not cover fails at once, as without it:
    /// node 0 killed (the job's root), a kill before the start (no
    /// checkpoint yet), a kill while the job finishes.
    #[test]
    fn with_fault_tolerance_node_zero_an_early_kill_and_a_kill_in_the_finish_still_fail_at_once() {
        let mut sup = sup_ft(3);
        sup.node_exited(0, KILL, s(2.0));
        assert!(matches!(
            sup.poll(s(2.0)),
            Some(JobEnd::Failed(Failure::NodeKilled {
                who: Who::Node(0),
                pid: 100,
                ..
            }))
        ));

        let mut sup = Supervisor::new(
            &[100, 101],
            99,
            Limits {
                exit_grace: GRACE,
                timeout: None,
                launch_timeout: None,
                coordinator_restarts: 0,
                coordinator_settle: SETTLE,
                recovery: Some(RECOVERY),
            },
        );
        sup.node_exited(1, KILL, s(0.2));
        assert!(matches!(
            sup.poll(s(0.2)),
            Some(JobEnd::Failed(Failure::NodeKilled {
                who: Who::Node(1),
                ..
            }))
        ));

        let mut sup = sup_ft(2);
        sup.node_exited(0, Exit::Code(0), s(1.0));
        sup.node_exited(1, KILL, s(1.1));
        assert!(matches!(
            sup.poll(s(1.1)),
            Some(JobEnd::Failed(Failure::NodeKilled {
                who: Who::Node(1),
                ..
            }))
        ));
    }

    /// Without fault tolerance a kill fails the job at once, and a later
    /// view without the node changes nothing.
    #[test]
    fn without_fault_tolerance_a_view_without_the_killed_node_changes_nothing() {
        let mut sup = sup(3);
        sup.members_seen(s(0.5), 1, &[100, 101, 102]);
        sup.node_exited(2, KILL, s(3.0));
        sup.members_seen(s(3.2), 2, &[100, 101]);
        assert!(sup.take_notes().is_empty());
        assert_eq!(sup.recoveries(), 0);
        assert!(matches!(
            sup.poll(s(3.2)),
            Some(JobEnd::Failed(Failure::NodeKilled {
                who: Who::Node(2),
                pid: 102,
                ..
            }))
        ));
    }

    /// A short job can recover and end between two looks at the
    /// coordinator. Every member exiting 0 says it recovered (the runtime
    /// ends the job with an error when it cannot); an error says the kill
    /// was the cause, and the failure names the killed node.
    #[test]
    fn with_fault_tolerance_the_finish_judges_a_kill_no_view_has_settled() {
        let mut sup = sup_ft(3);
        sup.node_exited(2, KILL, s(3.0));
        let end = end_normally(&mut sup, &[0, 1], 3.5);
        assert_eq!(
            end,
            Some(JobEnd::Completed {
                code: 0,
                disagreeing: vec![]
            })
        );
        assert_eq!(
            sup.take_notes(),
            vec!["node 2 (pid 102) was killed by signal 9 (SIGKILL); the job recovered without it and completed"]
        );
        assert_eq!(sup.recoveries(), 1);

        // No complete checkpoint yet: the runtime ends the job with an error.
        let mut sup = sup_ft(3);
        sup.node_exited(2, KILL, s(3.0));
        sup.node_exited(0, Exit::Code(EXIT_NODE_ABORTED), s(3.2));
        sup.node_exited(1, Exit::Code(EXIT_NODE_ABORTED), s(3.2));
        sup.coordinator_exited(Exit::Code(EXIT_NODE_ABORTED), s(3.2));
        assert_eq!(
            sup.poll(s(3.3)),
            Some(JobEnd::Failed(Failure::NodeKilled {
                who: Who::Node(2),
                pid: 102,
                exit: KILL,
                at: s(3.0)
            }))
        );
        assert!(sup.take_notes().is_empty());

        // The others hang after node 0's error: still the kill's fault.
        let mut sup = sup_ft(3);
        sup.node_exited(2, KILL, s(3.0));
        sup.node_exited(0, Exit::Code(1), s(3.2));
        assert_eq!(sup.poll(s(3.2) + GRACE - s(0.1)), None);
        assert!(matches!(
            sup.poll(s(3.2) + GRACE),
            Some(JobEnd::Failed(Failure::NodeKilled {
                who: Who::Node(2),
                ..
            }))
        ));
    }

    /// An admitted newcomer (a replacement) killed without notice is
    /// recovered from as a launch node is, and is not let go before.
    #[test]
    fn with_fault_tolerance_a_killed_newcomer_the_view_drops_is_a_recovery() {
        let mut sup = sup_ft(2);
        let n = sup.newcomer_spawned(200, s(1.0));
        sup.members_seen(s(2.0), 2, &[100, 101, 200]);
        assert!(sup.newcomer_admitted(n));
        sup.newcomer_exited(n, KILL, s(4.0));
        assert_eq!(sup.poll(s(4.0)), None);
        assert!(sup.forget_settled().is_empty(), "held until judged");
        sup.members_seen(s(4.1), 2, &[100, 101, 200]);
        assert!(sup.take_notes().is_empty());
        sup.members_seen(s(4.5), 3, &[100, 101]);
        assert_eq!(
            sup.take_notes(),
            vec!["newcomer 0 (pid 200) was killed by signal 9 (SIGKILL); the job recovered without it"]
        );
        assert_eq!(sup.forget_settled(), vec![n]);
        assert_eq!(sup.poll(s(100.0)), None);
        assert!(matches!(
            end_normally(&mut sup, &[0, 1], 101.0),
            Some(JobEnd::Completed { code: 0, .. })
        ));
    }
}
