//! Strangers flooding a listening endpoint, and the resource samples that
//! show it cost the target nothing that grows with the flood (issue 15,
//! item 4). Shared by the coordinator's own flood test
//! (`coordinator/tests/flood.rs`) and the whole-job one (`e2e/tests/faults.rs`).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

/// Bytes a garbage peer sends: an HTTP request, and a valid frame header
/// announcing a 1 MiB frame followed by a trickle that never completes it.
const GARBAGE: [&[u8]; 2] = [
    b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    b"DUCT\x02\x00\x00\x00\x00\x00\x10\x00xxxxxxxxxxxxxxxxxxxxxxxx",
];

/// Strangers hammering one address until [`Flood::stop`].
pub struct Flood {
    stop: Arc<AtomicBool>,
    dialled: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Flood {
    /// `idle` threads each holding up to `held` idle connections (the
    /// oldest dropped and a new one dialled, over and over), and `garbage`
    /// threads sending bytes that are not frames (alternately the two kinds
    /// of [`GARBAGE`]) and reading until the peer closes.
    pub fn start(addr: &str, idle: usize, held: usize, garbage: usize) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let dialled = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for _ in 0..idle {
            let (addr, stop, dialled) = (addr.to_owned(), stop.clone(), dialled.clone());
            threads.push(thread::spawn(move || {
                let mut open = VecDeque::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(s) = TcpStream::connect(&addr) {
                        dialled.fetch_add(1, Ordering::Relaxed);
                        open.push_back(s);
                    }
                    if open.len() > held {
                        open.pop_front();
                    }
                    thread::sleep(Duration::from_millis(1));
                }
            }));
        }
        for i in 0..garbage {
            let (addr, stop, dialled) = (addr.to_owned(), stop.clone(), dialled.clone());
            threads.push(thread::spawn(move || {
                let junk = GARBAGE[i % GARBAGE.len()];
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect(&addr) else {
                        thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    dialled.fetch_add(1, Ordering::Relaxed);
                    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                    let _ = s.write_all(junk);
                    let mut sink = [0u8; 256];
                    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
                }
            }));
        }
        Flood {
            stop,
            dialled,
            threads,
        }
    }

    /// Connections dialled so far.
    pub fn dialled(&self) -> u64 {
        self.dialled.load(Ordering::Relaxed)
    }

    /// Stops every stranger and closes their connections.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Open descriptors and threads of process `pid` (0 and 0 once it is gone).
pub fn fds_and_threads(pid: u32) -> (usize, usize) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    (fds, threads)
}

/// The most descriptors and threads process `pid` had, sampled every 20 ms
/// until [`Peak::stop`].
pub struct Peak {
    stop: Arc<AtomicBool>,
    worst: mpsc::Receiver<(usize, usize)>,
}

impl Peak {
    /// Starts sampling `pid`.
    pub fn watch(pid: u32) -> Peak {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, worst) = mpsc::channel();
        let s = stop.clone();
        thread::spawn(move || {
            let mut worst = (0, 0);
            while !s.load(Ordering::Relaxed) {
                let (f, t) = fds_and_threads(pid);
                worst = (worst.0.max(f), worst.1.max(t));
                thread::sleep(Duration::from_millis(20));
            }
            let _ = tx.send(worst);
        });
        Peak { stop, worst }
    }

    /// Stops sampling: the most descriptors and the most threads seen.
    pub fn stop(self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.worst
            .recv_timeout(Duration::from_secs(10))
            .expect("the sampler ended")
    }
}
