//! The launcher's request channel: how `ductile expand` and `ductile rescale`
//! ask a running `ductile run` to start newcomers as its own children, so they
//! are supervised, logged and stopped like the launch members.
//!
//! A Unix-domain socket, `STATE/launcher.sock`, readable and writable by the
//! job's user only (mode 0600, set before the socket appears under its name;
//! the same trust as the job secret beside it). One request per connection,
//! one line each way:
//!
//! ```text
//! spawn K            ->  ok PID,PID,...      start K newcomers (1..=64); their pids
//! spawn K pes=P      ->  ok PID,PID,...      the same, each running P PEs (1..=1024)
//!                                            instead of the job's --pes-per-node
//! stop PID,PID,...   ->  ok PID,PID,...      SIGTERM newcomers not (yet) admitted; those stopped
//! anything else      ->  error MESSAGE
//! ```
//!
//! The parsing is pure ([`parse_request`], [`parse_reply`]); [`Channel`] is
//! the launcher's end (a thread accepts connections and hands each request to
//! the supervision loop, which answers), [`request`] the tools' end.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::process::POLL_INTERVAL;

/// Most newcomers one `spawn` request may start.
pub const MAX_SPAWN: u32 = 64;

/// Most PEs a `spawn K pes=P` newcomer may run (a bound on typos, not a
/// limit of the runtime: `ductile run --pes-per-node` takes any count).
pub const MAX_SPAWN_PES: u32 = 1024;

/// Longest request or reply line accepted, in bytes (a reply lists at most
/// [`MAX_SPAWN`] pids, or one message).
const MAX_LINE: u64 = 4096;

/// How long the launcher's end waits for a client to send its line, and for
/// the supervision loop to answer it.
const SERVE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a tool asks the launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Start this many newcomers.
    Spawn {
        /// How many, `1..=MAX_SPAWN`.
        count: u32,
        /// PEs each runs, `1..=MAX_SPAWN_PES`; `None`: the job's
        /// `--pes-per-node`. A local fleet may mix node shapes (an
        /// instance type of the local cloud with more vCPUs).
        pes: Option<u32>,
    },
    /// Stop these newcomers, which must not have been admitted.
    Stop {
        /// Their pids.
        pids: Vec<u32>,
    },
    /// When the job ends with the checkpointed exit code, launch it again
    /// with `nodes` nodes, restoring from `dir` (the restart baseline).
    Restart {
        /// Node count of the relaunched job.
        nodes: u32,
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// Forget the arranged restart (its checkpoint was withdrawn).
    CancelRestart,
}

/// The launcher's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Done: the pids started (`spawn`) or stopped (`stop`).
    Ok(Vec<u32>),
    /// Refused or failed, with the reason.
    Error(String),
}

fn join_pids(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_pids(text: &str) -> Result<Vec<u32>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|p| match p.parse::<u32>() {
            Ok(pid) if pid > 1 => Ok(pid),
            _ => Err(format!("{p:?} is not a pid")),
        })
        .collect()
}

impl Request {
    /// The request as sent, newline included.
    pub fn to_line(&self) -> String {
        match self {
            Request::Spawn { count, pes: None } => format!("spawn {count}\n"),
            Request::Spawn {
                count,
                pes: Some(pes),
            } => format!("spawn {count} pes={pes}\n"),
            Request::Stop { pids } => format!("stop {}\n", join_pids(pids)),
            Request::Restart { nodes, dir } => format!("restart {nodes} {}\n", dir.display()),
            Request::CancelRestart => "cancel-restart\n".to_owned(),
        }
    }
}

impl Reply {
    /// The reply as sent, newline included; a message is kept on one line.
    pub fn to_line(&self) -> String {
        match self {
            Reply::Ok(pids) => format!("ok {}\n", join_pids(pids)),
            Reply::Error(message) => format!("error {}\n", message.replace(['\n', '\r'], " ")),
        }
    }
}

/// Parses one request line (with or without its newline).
pub fn parse_request(line: &str) -> Result<Request, String> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    let (verb, rest) = line.split_once(' ').unwrap_or((line, ""));
    match verb {
        "spawn" => {
            let (count, pes) = match rest.split_once(' ') {
                Some((count, option)) => (count, Some(option)),
                None => (rest, None),
            };
            let count = match count.parse::<u32>() {
                Ok(count) if (1..=MAX_SPAWN).contains(&count) => count,
                _ => {
                    return Err(format!(
                        "spawn takes a number of newcomers from 1 to {MAX_SPAWN}, not {rest:?}"
                    ))
                }
            };
            let pes = match pes {
                None => None,
                Some(option) => match option.strip_prefix("pes=").map(str::parse::<u32>) {
                    Some(Ok(pes)) if (1..=MAX_SPAWN_PES).contains(&pes) => Some(pes),
                    _ => {
                        return Err(format!(
                            "spawn K takes at most `pes=P`, P from 1 to {MAX_SPAWN_PES}, not {option:?}"
                        ))
                    }
                },
            };
            Ok(Request::Spawn { count, pes })
        }
        "stop" => {
            let pids = parse_pids(rest)?;
            if pids.is_empty() {
                return Err("stop takes one or more pids, separated by commas".to_owned());
            }
            Ok(Request::Stop { pids })
        }
        "restart" => {
            let (nodes, dir) = rest.split_once(' ').unwrap_or((rest, ""));
            match nodes.parse::<u32>() {
                Ok(nodes) if nodes >= 1 && !dir.is_empty() => Ok(Request::Restart {
                    nodes,
                    dir: PathBuf::from(dir),
                }),
                _ => Err(format!(
                    "restart takes a node count of at least 1 and a directory, not {rest:?}"
                )),
            }
        }
        "cancel-restart" if rest.is_empty() => Ok(Request::CancelRestart),
        "cancel-restart" => Err(format!("cancel-restart takes nothing, not {rest:?}")),
        _ => Err(format!(
            "unknown request {verb:?}: expected `spawn K [pes=P]`, `stop PID,...`, `restart N DIR` or `cancel-restart`"
        )),
    }
}

/// Parses one reply line (with or without its newline).
pub fn parse_reply(line: &str) -> Result<Reply, String> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    if let Some(pids) = line.strip_prefix("ok ").or((line == "ok").then_some("")) {
        return parse_pids(pids).map(Reply::Ok);
    }
    if let Some(message) = line.strip_prefix("error ") {
        return Ok(Reply::Error(message.to_owned()));
    }
    Err(format!("{line:?} is not a reply"))
}

/// A request waiting for the supervision loop's answer.
#[derive(Debug)]
pub struct Pending {
    /// What was asked.
    pub request: Request,
    reply: mpsc::Sender<Reply>,
}

impl Pending {
    /// Answers the request (a client that gave up is no error).
    pub fn answer(self, reply: Reply) {
        let _ = self.reply.send(reply);
    }
}

/// The launcher's end of the channel: the socket and the thread that serves
/// it. Dropping it stops the thread and removes the socket.
#[derive(Debug)]
pub struct Channel {
    path: PathBuf,
    requests: mpsc::Receiver<Pending>,
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Channel {
    /// Creates the socket at `path` (mode 0600 before it appears there) and
    /// starts serving it.
    pub fn open(path: &Path) -> io::Result<Self> {
        // No longer than `launcher.sock` (pids have at most 7 digits), so
        // the length check of the state directory covers it too.
        let tmp = path.with_file_name(format!(".sock.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp)?;
        let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(err) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(err);
        }
        listener.set_nonblocking(true)?;
        let (tx, requests) = mpsc::channel();
        let done = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&done);
        let thread = thread::Builder::new()
            .name("ductile-launcher-channel".to_owned())
            .spawn(move || serve(&listener, &tx, &stop))?;
        Ok(Self {
            path: path.to_path_buf(),
            requests,
            done,
            thread: Some(thread),
        })
    }

    /// The next request to answer, if any (never blocks).
    pub fn try_next(&self) -> Option<Pending> {
        self.requests.try_recv().ok()
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            // A request handed over just now would keep the thread waiting
            // for an answer: refuse it.
            while !thread.is_finished() {
                while let Ok(pending) = self.requests.try_recv() {
                    pending.answer(Reply::Error("the job is ending".to_owned()));
                }
                thread::sleep(POLL_INTERVAL);
            }
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(listener: &UnixListener, requests: &mpsc::Sender<Pending>, done: &AtomicBool) {
    while !done.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(err) = serve_one(stream, requests) {
                    tracing::debug!(%err, "launcher channel: a request failed");
                }
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => thread::sleep(POLL_INTERVAL),
            Err(err) => {
                tracing::warn!(%err, "launcher channel: accept failed");
                thread::sleep(POLL_INTERVAL);
            }
        }
    }
}

fn serve_one(stream: UnixStream, requests: &mpsc::Sender<Pending>) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(SERVE_TIMEOUT))?;
    stream.set_write_timeout(Some(SERVE_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_LINE)).read_line(&mut line)?;
    let reply = match parse_request(&line) {
        Err(message) => Reply::Error(message),
        Ok(request) => {
            let (tx, rx) = mpsc::channel();
            let asked = requests.send(Pending { request, reply: tx });
            match asked
                .ok()
                .and_then(|()| rx.recv_timeout(SERVE_TIMEOUT).ok())
            {
                Some(reply) => reply,
                None => Reply::Error(
                    "the launcher is not taking requests (the job is ending)".to_owned(),
                ),
            }
        }
    };
    (&stream).write_all(reply.to_line().as_bytes())
}

/// Why a request to the launcher got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// Nothing listens at the socket: no launcher runs the job.
    #[error("no launcher answers at {} ({source}); is the job running under `ductile run`?", path.display())]
    NoLauncher {
        /// The socket's path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The conversation broke (timeout, closed early, an unreadable reply).
    #[error("the launcher at {} did not answer: {reason}", path.display())]
    Broken {
        /// The socket's path.
        path: PathBuf,
        /// What happened.
        reason: String,
    },
    /// The launcher answered with an error ([`ask`] only).
    #[error("the launcher refused `{request}`: {reason}")]
    Refused {
        /// The request, as sent.
        request: String,
        /// The launcher's message.
        reason: String,
    },
}

/// [`request`], with an error reply as an error: the pids of an `ok`.
pub fn ask(socket: &Path, req: &Request, timeout: Duration) -> Result<Vec<u32>, ChannelError> {
    match request(socket, req, timeout)? {
        Reply::Ok(pids) => Ok(pids),
        Reply::Error(reason) => Err(ChannelError::Refused {
            request: req.to_line().trim_end().to_owned(),
            reason,
        }),
    }
}

/// Sends `request` to the launcher listening at `socket` and returns its
/// reply, all within `timeout`.
pub fn request(socket: &Path, request: &Request, timeout: Duration) -> Result<Reply, ChannelError> {
    let stream = UnixStream::connect(socket).map_err(|source| ChannelError::NoLauncher {
        path: socket.to_path_buf(),
        source,
    })?;
    let broken = |reason: String| ChannelError::Broken {
        path: socket.to_path_buf(),
        reason,
    };
    let timeout = timeout.max(Duration::from_millis(1));
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .and_then(|()| (&stream).write_all(request.to_line().as_bytes()))
        .map_err(|e| broken(e.to_string()))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_LINE))
        .read_line(&mut line)
        .map_err(|e| broken(e.to_string()))?;
    if line.is_empty() {
        return Err(broken("it closed the connection".to_owned()));
    }
    parse_reply(&line).map_err(broken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_print_as_lines() {
        let table: &[(&str, Result<Request, &str>)] = &[
            ("spawn 2\n", Ok(Request::Spawn { count: 2, pes: None })),
            ("spawn 64", Ok(Request::Spawn { count: 64, pes: None })),
            (
                "spawn 1 pes=2\n",
                Ok(Request::Spawn {
                    count: 1,
                    pes: Some(2),
                }),
            ),
            (
                "spawn 3 pes=1024",
                Ok(Request::Spawn {
                    count: 3,
                    pes: Some(1024),
                }),
            ),
            (
                "spawn 1 pes=0\n",
                Err("spawn K takes at most `pes=P`, P from 1 to 1024, not \"pes=0\""),
            ),
            (
                "spawn 1 pes=1025\n",
                Err("spawn K takes at most `pes=P`, P from 1 to 1024, not \"pes=1025\""),
            ),
            (
                "spawn 1 pes=\n",
                Err("spawn K takes at most `pes=P`, P from 1 to 1024, not \"pes=\""),
            ),
            (
                "spawn 1 cores=2\n",
                Err("spawn K takes at most `pes=P`, P from 1 to 1024, not \"cores=2\""),
            ),
            (
                "spawn 1 pes=2 pes=3\n",
                Err("spawn K takes at most `pes=P`, P from 1 to 1024, not \"pes=2 pes=3\""),
            ),
            (
                "spawn pes=2\n",
                Err("spawn takes a number of newcomers from 1 to 64, not \"pes=2\""),
            ),
            (
                "spawn 0\n",
                Err("spawn takes a number of newcomers from 1 to 64, not \"0\""),
            ),
            (
                "spawn 65\n",
                Err("spawn takes a number of newcomers from 1 to 64, not \"65\""),
            ),
            (
                "spawn\n",
                Err("spawn takes a number of newcomers from 1 to 64, not \"\""),
            ),
            (
                "spawn -1\n",
                Err("spawn takes a number of newcomers from 1 to 64, not \"-1\""),
            ),
            (
                "spawn  2\n",
                Err("spawn takes a number of newcomers from 1 to 64, not \" 2\""),
            ),
            (
                "stop 4711,4712\n",
                Ok(Request::Stop {
                    pids: vec![4711, 4712],
                }),
            ),
            (
                "stop\n",
                Err("stop takes one or more pids, separated by commas"),
            ),
            ("stop 4711,,2\n", Err("\"\" is not a pid")),
            ("stop 1\n", Err("\"1\" is not a pid")),
            (
                "SPAWN 1\n",
                Err("unknown request \"SPAWN\": expected `spawn K [pes=P]`, `stop PID,...`, `restart N DIR` or `cancel-restart`"),
            ),
            (
                "",
                Err("unknown request \"\": expected `spawn K [pes=P]`, `stop PID,...`, `restart N DIR` or `cancel-restart`"),
            ),
            (
                "restart 3 /tmp/job/ckpt\n",
                Ok(Request::Restart {
                    nodes: 3,
                    dir: PathBuf::from("/tmp/job/ckpt"),
                }),
            ),
            (
                "restart 0 /tmp/ckpt\n",
                Err("restart takes a node count of at least 1 and a directory, not \"0 /tmp/ckpt\""),
            ),
            (
                "restart 2\n",
                Err("restart takes a node count of at least 1 and a directory, not \"2\""),
            ),
            ("cancel-restart\n", Ok(Request::CancelRestart)),
            (
                "cancel-restart 3\n",
                Err("cancel-restart takes nothing, not \"3\""),
            ),
        ];
        for (line, want) in table {
            let got = parse_request(line);
            assert_eq!(got, want.clone().map_err(str::to_owned), "{line:?}");
            if let Ok(request) = got {
                assert_eq!(parse_request(&request.to_line()), Ok(request));
            }
        }
    }

    #[test]
    fn replies_parse_and_print_as_lines() {
        let table: &[(&str, Result<Reply, &str>)] = &[
            ("ok 4711,4712\n", Ok(Reply::Ok(vec![4711, 4712]))),
            ("ok \n", Ok(Reply::Ok(vec![]))),
            ("ok\n", Ok(Reply::Ok(vec![]))),
            (
                "error the job is ending\n",
                Ok(Reply::Error("the job is ending".into())),
            ),
            ("ok x\n", Err("\"x\" is not a pid")),
            ("okay\n", Err("\"okay\" is not a reply")),
            ("", Err("\"\" is not a reply")),
        ];
        for (line, want) in table {
            let got = parse_reply(line);
            assert_eq!(got, want.clone().map_err(str::to_owned), "{line:?}");
            if let Ok(reply) = got {
                assert_eq!(parse_reply(&reply.to_line()), Ok(reply));
            }
        }
        // A message with line breaks stays one line.
        let line = Reply::Error("two\nlines".into()).to_line();
        assert_eq!(line, "error two lines\n");
    }

    #[test]
    fn the_socket_is_private_and_requests_reach_the_loop() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("launcher.sock");
        let channel = Channel::open(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        // The loop's side, on this thread; the tool's side on another.
        let tool = {
            let path = path.clone();
            thread::spawn(move || {
                request(&path, &Request::Spawn { count: 2, pes: None }, Duration::from_secs(10))
            })
        };
        let pending = loop {
            if let Some(p) = channel.try_next() {
                break p;
            }
            thread::sleep(POLL_INTERVAL);
        };
        assert_eq!(pending.request, Request::Spawn { count: 2, pes: None });
        pending.answer(Reply::Ok(vec![100, 101]));
        assert_eq!(tool.join().unwrap().unwrap(), Reply::Ok(vec![100, 101]));

        // A bad line is answered by the channel itself.
        let reply = request_raw(&path, "grow please\n");
        assert!(
            reply.starts_with("error unknown request \"grow\""),
            "{reply}"
        );

        drop(channel);
        assert!(!path.exists(), "socket left behind");
        let err = request(&path, &Request::Spawn { count: 1, pes: None }, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, ChannelError::NoLauncher { .. }), "{err}");
        assert!(err.to_string().contains("no launcher answers"), "{err}");
    }

    fn request_raw(path: &Path, line: &str) -> String {
        let mut stream = UnixStream::connect(path).unwrap();
        stream.write_all(line.as_bytes()).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    }
}
