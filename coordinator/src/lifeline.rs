//! The local launcher's lifeline: how the processes a launcher started (the
//! coordinator, every node, and any wrapper script in between) notice that
//! the launcher is gone, however it went (SIGKILL and the OOM killer too).
//!
//! The launcher makes a pipe, keeps its write end to itself (close-on-exec)
//! and hands the read end down to every process it starts, its number in
//! [`ENV_LAUNCHER_FD`]. Nobody ever writes to it: when the launcher's process
//! ends, the kernel closes the write end and every reader sees end-of-file.
//! Unlike asking whether the parent is still the launcher, this holds when a
//! wrapper script runs the program without `exec` (the descriptor is
//! inherited through the script), and it needs no polling.
//!
//! Only the local fleet sets the variable; on Kubernetes there is no
//! launcher and [`watch`] does nothing.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileTypeExt;

/// Local fleet only: the number of an inherited file descriptor, the read end
/// of a pipe whose write end only the launcher holds (see the module docs).
pub const ENV_LAUNCHER_FD: &str = "DUCTILE_LAUNCHER_FD";

/// Why the lifeline could not be watched.
#[derive(Debug, thiserror::Error)]
pub enum LifelineError {
    /// The variable is not a descriptor number.
    #[error("{ENV_LAUNCHER_FD}={0:?} is not a file descriptor number")]
    NotANumber(String),
    /// The descriptor is not open in this process (a wrapper closed it).
    #[error("{ENV_LAUNCHER_FD}={fd}: the descriptor is not open here ({error}); the launcher's end cannot be watched")]
    NotOpen {
        /// The descriptor.
        fd: u32,
        /// The cause.
        error: std::io::Error,
    },
    /// The descriptor is something other than a pipe.
    #[error(
        "{ENV_LAUNCHER_FD}={0}: the descriptor is not a pipe; the launcher's end cannot be watched"
    )]
    NotAPipe(u32),
    /// The watching thread could not start.
    #[error("cannot start the launcher watchdog thread: {0}")]
    Thread(std::io::Error),
}

/// Opens the lifeline named by `value` (the variable's text): a new read
/// handle on the same pipe (through `/proc/self/fd`, which for a pipe never
/// blocks and needs no `unsafe`).
pub fn open(value: &str) -> Result<File, LifelineError> {
    let fd: u32 = value
        .trim()
        .parse()
        .map_err(|_| LifelineError::NotANumber(value.to_owned()))?;
    let path = format!("/proc/self/fd/{fd}");
    let meta = std::fs::metadata(&path).map_err(|error| LifelineError::NotOpen { fd, error })?;
    if !meta.file_type().is_fifo() {
        return Err(LifelineError::NotAPipe(fd));
    }
    File::open(&path).map_err(|error| LifelineError::NotOpen { fd, error })
}

/// Blocks until the pipe's writers are all gone (end-of-file); bytes, if
/// anyone wrote some, are ignored. Returns the error that stopped the
/// watch otherwise.
pub fn wait_gone(mut pipe: File) -> std::io::Result<()> {
    let mut buf = [0u8; 64];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// When [`ENV_LAUNCHER_FD`] is set: starts a thread that calls `on_gone` once
/// the launcher is gone, and returns `Ok(true)`. Unset: `Ok(false)`, nothing
/// to watch. The caller decides what "gone" means for it (typically: say so
/// and exit).
pub fn watch(on_gone: impl FnOnce() + Send + 'static) -> Result<bool, LifelineError> {
    let Some(value) = std::env::var_os(ENV_LAUNCHER_FD) else {
        return Ok(false);
    };
    let pipe = open(&value.to_string_lossy())?;
    std::thread::Builder::new()
        .name("ductile-lifeline".into())
        .spawn(move || match wait_gone(pipe) {
            Ok(()) => on_gone(),
            Err(error) => {
                tracing::warn!(%error, "the launcher's lifeline broke; no longer watched")
            }
        })
        .map_err(LifelineError::Thread)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn end_of_file_once_the_write_end_closes() {
        let (reader, writer) = std::io::pipe().unwrap();
        let fd = reader.as_raw_fd();
        let pipe = open(&fd.to_string()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(wait_gone(pipe).is_ok()));
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(200))
                .is_err(),
            "the writer lives: no end-of-file yet"
        );
        drop(writer);
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)),
            Ok(true)
        );
        drop(reader);
    }

    #[test]
    fn bad_values_are_named() {
        assert!(matches!(open("x"), Err(LifelineError::NotANumber(_))));
        assert!(matches!(
            open("987654"),
            Err(LifelineError::NotOpen { fd: 987654, .. })
        ));
        let file = File::open("/proc/self/status").unwrap();
        assert!(matches!(
            open(&file.as_raw_fd().to_string()),
            Err(LifelineError::NotAPipe(_))
        ));
    }
}
