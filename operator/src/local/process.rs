//! OS process plumbing for the local fleet: how a child ended, and how to stop
//! a child's whole process group (SIGTERM, a grace period, then SIGKILL).
//!
//! Every child the launcher starts leads its own process group, so a signal
//! sent to the group reaches whatever the child itself started too, and a
//! Ctrl-C in the terminal reaches only the launcher, which decides what to do.

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// The launcher's lifeline ([`ductile_coordinator::lifeline`]): a pipe made
/// once per launcher process and kept until the process ends. Its read end,
/// without close-on-exec, is inherited by every process the launcher starts
/// (and by whatever those start, wrapper scripts included); its write end,
/// close-on-exec, is held here only. When the launcher ends, however it ends,
/// the kernel closes the write end and every child's watchdog sees
/// end-of-file.
struct Lifeline {
    reader: std::io::PipeReader,
    _writer: std::io::PipeWriter,
}

static LIFELINE: std::sync::OnceLock<Result<Lifeline, String>> = std::sync::OnceLock::new();

/// The descriptor number children find the lifeline at (the value of
/// [`ductile_coordinator::lifeline::ENV_LAUNCHER_FD`]); made on first use.
pub fn lifeline_fd() -> Result<i32, String> {
    use std::os::fd::AsRawFd;
    let made = LIFELINE.get_or_init(|| {
        let (reader, writer) = std::io::pipe()
            .map_err(|e| format!("cannot make the launcher's lifeline pipe: {e}"))?;
        // Children inherit the read end only.
        nix::fcntl::fcntl(
            &reader,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(|e| format!("cannot hand the launcher's lifeline down: {e}"))?;
        Ok(Lifeline {
            reader,
            _writer: writer,
        })
    });
    made.as_ref()
        .map(|line| line.reader.as_raw_fd())
        .map_err(Clone::clone)
}

/// How often the launcher looks at its children. Short enough that an exit is
/// seen promptly, long enough to cost nothing.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How a process ended, in the terms a user reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal number.
    Signal {
        /// The signal number.
        signal: i32,
        /// Whether it dumped core.
        core_dumped: bool,
    },
}

impl Exit {
    /// Interprets a wait status.
    pub fn from_status(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(signal)) => Exit::Signal {
                signal,
                core_dumped: status.core_dumped(),
            },
            // Stopped/continued statuses are never returned by wait() without
            // WUNTRACED; treat the impossible case as a failure, not a success.
            (None, None) => Exit::Code(-1),
        }
    }

    /// The exit code, when the process exited rather than being killed.
    pub fn code(self) -> Option<i32> {
        match self {
            Exit::Code(code) => Some(code),
            Exit::Signal { .. } => None,
        }
    }

    /// The code a shell would report for this exit (128 + signal when killed).
    pub fn shell_code(self) -> i32 {
        match self {
            Exit::Code(code) => code,
            Exit::Signal { signal, .. } => 128 + signal,
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Exit::Code(code) => write!(f, "exited with code {code}"),
            Exit::Signal {
                signal,
                core_dumped,
            } => {
                write!(f, "was killed by signal {signal} ({})", signal_name(signal))?;
                if core_dumped {
                    f.write_str(", core dumped")?;
                }
                Ok(())
            }
        }
    }
}

/// `SIGKILL` for 9, and so on; `signal N` for numbers this platform does not name.
pub fn signal_name(signal: i32) -> String {
    match Signal::try_from(signal) {
        Ok(sig) => sig.as_str().to_owned(),
        Err(_) => format!("signal {signal}"),
    }
}

/// Whether a process with this pid exists (a zombie counts; so does a process
/// of another user, which we may not signal but which is alive all the same).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    match kill(Pid::from_raw(raw), None) {
        Ok(()) => true,
        Err(Errno::EPERM) => true,
        Err(_) => false,
    }
}

/// Whether any process is left in the process group led (once) by `pgid`.
pub fn group_alive(pgid: u32) -> bool {
    let Ok(raw) = i32::try_from(pgid) else {
        return false;
    };
    if raw <= 1 {
        return false;
    }
    match killpg(Pid::from_raw(raw), None) {
        Ok(()) => true,
        Err(Errno::EPERM) => true,
        Err(_) => false,
    }
}

/// Sends `signal` to the process group `pgid`; a group that is already gone is
/// not an error.
pub fn signal_group(pgid: u32, signal: Signal) {
    let Ok(raw) = i32::try_from(pgid) else { return };
    // Never signal group 0 or 1: that would be our own group or init's.
    if raw <= 1 {
        return;
    }
    match killpg(Pid::from_raw(raw), signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(err) => tracing::warn!(pgid, %signal, %err, "could not signal process group"),
    }
}

/// A child this launcher started and must account for.
#[derive(Debug)]
pub struct Supervised {
    /// What the user calls it: `node 3`, `the coordinator`.
    pub label: String,
    /// The child; its pid is also its process group id.
    pub child: Child,
    /// How it ended, once reaped.
    pub exit: Option<Exit>,
}

impl Supervised {
    /// Wraps a freshly spawned child that leads its own process group.
    pub fn new(label: impl Into<String>, child: Child) -> Self {
        Self {
            label: label.into(),
            child,
            exit: None,
        }
    }

    /// The child's pid (and process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reaps the child if it has ended, without blocking. Returns the exit the
    /// first time it is seen.
    pub fn poll(&mut self) -> Option<Exit> {
        if self.exit.is_some() {
            return None;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => {
                let exit = Exit::from_status(status);
                self.exit = Some(exit);
                Some(exit)
            }
            Ok(None) => None,
            Err(err) => {
                // ECHILD and friends: nothing more can be learnt about it.
                tracing::warn!(label = %self.label, %err, "cannot wait for child");
                self.exit = Some(Exit::Code(-1));
                self.exit
            }
        }
    }
}

/// Stops every listed child's process group: `first` (SIGTERM, or the signal
/// the user sent us), then SIGKILL to whatever remains after `grace`, then
/// reaps. Returns whether everything is gone. `hurry` is polled while waiting:
/// when it returns true (a second Ctrl-C) the grace period is cut short.
pub fn stop_all(
    children: &mut [&mut Supervised],
    first: Signal,
    grace: Duration,
    mut hurry: impl FnMut() -> bool,
) -> bool {
    for child in children.iter() {
        signal_group(child.pid(), first);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && !hurry() {
        for child in children.iter_mut() {
            child.poll();
        }
        if children
            .iter()
            .all(|c| c.exit.is_some() && !group_alive(c.pid()))
        {
            return true;
        }
        thread::sleep(POLL_INTERVAL);
    }
    for child in children.iter() {
        signal_group(child.pid(), Signal::SIGKILL);
    }
    // SIGKILL cannot be caught; a process in uninterruptible sleep may still
    // take a moment. Bounded all the same: we never wait forever.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for child in children.iter_mut() {
            child.poll();
        }
        let gone = children
            .iter()
            .all(|c| c.exit.is_some() && !group_alive(c.pid()));
        if gone || Instant::now() >= deadline {
            return gone;
        }
        thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_is_read_from_the_wait_status() {
        assert_eq!(Exit::from_status(ExitStatus::from_raw(0)), Exit::Code(0));
        assert_eq!(
            Exit::from_status(ExitStatus::from_raw(3 << 8)),
            Exit::Code(3)
        );
        assert_eq!(
            Exit::from_status(ExitStatus::from_raw(255 << 8)),
            Exit::Code(255)
        );
    }

    #[test]
    fn killing_signal_is_read_from_the_wait_status() {
        let exit = Exit::from_status(ExitStatus::from_raw(9));
        assert_eq!(
            exit,
            Exit::Signal {
                signal: 9,
                core_dumped: false
            }
        );
        assert_eq!(exit.to_string(), "was killed by signal 9 (SIGKILL)");
        assert_eq!(exit.code(), None);
        assert_eq!(exit.shell_code(), 137);

        let exit = Exit::from_status(ExitStatus::from_raw(11 | 0x80));
        assert_eq!(
            exit,
            Exit::Signal {
                signal: 11,
                core_dumped: true
            }
        );
        assert_eq!(
            exit.to_string(),
            "was killed by signal 11 (SIGSEGV), core dumped"
        );
    }

    #[test]
    fn code_exit_reads_naturally() {
        assert_eq!(Exit::Code(2).to_string(), "exited with code 2");
        assert_eq!(Exit::Code(2).shell_code(), 2);
    }

    #[test]
    fn unknown_signal_numbers_are_still_named() {
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(200), "signal 200");
    }

    #[test]
    fn own_pid_is_alive_and_nonsense_pids_are_not() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(0));
        assert!(!pid_alive(u32::MAX));
    }
}
