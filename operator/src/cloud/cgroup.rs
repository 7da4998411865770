//! Real instance speed: a CPU quota per instance through the cgroup v1 `cpu`
//! controller (`cpu.cfs_quota_us` over `cpu.cfs_period_us`).
//!
//! Each job gets a directory `ductile-<job>-<launcher pid>` under the
//! controller's mount, and each instance a child directory holding its
//! node's processes. The period is short (10 ms by default, the scenario's
//! `cpuPeriodMs`) so a throttled node is slow evenly, not in bursts; a
//! quota the kernel would refuse (under 1 ms per period) gets a longer
//! period instead. Everything created is removed when the [`Quotas`] is
//! dropped (after its processes are gone).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The default CFS period: short, so latency is not bursty.
pub const PERIOD_US: u64 = 10_000;

/// The smallest quota per period the kernel accepts (`cpu.cfs_quota_us`).
const MIN_QUOTA_US: u64 = 1_000;

/// The longest period the kernel accepts (`cpu.cfs_period_us`, 1 s).
const MAX_PERIOD_US: u64 = 1_000_000;

/// The period and quota, in µs, that give `cores` with a period of
/// `period_us`, or the shortest longer one whose quota the kernel accepts
/// (0.3 cores with a 1 ms period: 3334 µs, quota 1000).
pub fn period_and_quota(cores: f64, period_us: u64) -> (u64, u64) {
    let period = period_us
        .max((MIN_QUOTA_US as f64 / cores).ceil() as u64)
        .min(MAX_PERIOD_US);
    let quota = ((cores * period as f64).round() as u64).max(MIN_QUOTA_US);
    (period, quota)
}

/// Where the cgroup v1 `cpu` controller is mounted on Debian and most
/// distributions.
pub const CPU_CONTROLLER: &str = "/sys/fs/cgroup/cpu";

/// The CPU quotas of one job's instances.
#[derive(Debug)]
pub struct Quotas {
    root: PathBuf,
    /// The CFS period asked for, µs.
    period_us: u64,
    instances: Vec<PathBuf>,
}

impl Quotas {
    /// Creates the job's cgroup under `controller`, its instances' quotas
    /// over periods of `period_us` (see [`period_and_quota`]); an error
    /// means quotas cannot be used here (not root, no v1 `cpu` controller,
    /// read-only).
    pub fn create(controller: &Path, job: &str, period_us: u64) -> io::Result<Self> {
        let quota_file = controller.join("cpu.cfs_quota_us");
        if !quota_file.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no cgroup v1 cpu controller at {}", controller.display()),
            ));
        }
        let root = controller.join(format!("ductile-{job}-{}", std::process::id()));
        fs::create_dir(&root)?;
        Ok(Quotas {
            root,
            period_us,
            instances: Vec::new(),
        })
    }

    /// The job's cgroup directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Gives `instance` `cores` of CPU (e.g. 0.5: half a core): its
    /// group, made once, for a process to join (`ductile run
    /// --node-cgroups`, or [`Quotas::place`]).
    pub fn prepare(&mut self, instance: &str, cores: f64) -> io::Result<PathBuf> {
        let dir = self.root.join(instance);
        if !dir.exists() {
            fs::create_dir(&dir)?;
            self.instances.push(dir.clone());
            let (period, quota) = period_and_quota(cores, self.period_us);
            fs::write(dir.join("cpu.cfs_period_us"), period.to_string())?;
            fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())?;
        }
        Ok(dir)
    }

    /// Gives `instance` `cores` of CPU and moves `pid` (the whole process,
    /// every thread) into it.
    pub fn place(&mut self, instance: &str, cores: f64, pid: u32) -> io::Result<()> {
        let dir = self.prepare(instance, cores)?;
        // cgroup.procs moves every thread of the process; threads it starts
        // later inherit the group.
        fs::write(dir.join("cgroup.procs"), pid.to_string())
    }

    /// How often the instance was throttled: CFS periods throttled and the
    /// seconds its processes waited for quota.
    pub fn throttled(&self, instance: &str) -> Option<(u64, f64)> {
        let stat = fs::read_to_string(self.root.join(instance).join("cpu.stat")).ok()?;
        let field = |name: &str| {
            stat.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
        };
        Some((field("nr_throttled ")?, field("throttled_time ")? as f64 / 1e9))
    }
}

impl Drop for Quotas {
    fn drop(&mut self) {
        // A cgroup can be removed once its processes are gone; processes
        // still exiting get a moment, stragglers are moved to the parent.
        let parent = self.root.parent().unwrap_or(Path::new(CPU_CONTROLLER)).to_path_buf();
        for dir in self.instances.iter().rev().chain(std::iter::once(&self.root)) {
            remove_patiently(dir, &parent);
        }
    }
}

/// Removes a cgroup directory, retrying for up to 2 s while it is busy.
fn remove_patiently(dir: &Path, parent: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) if std::time::Instant::now() >= deadline => {
                tracing::warn!(dir = %dir.display(), "cannot remove a cgroup: {e}");
                return;
            }
            Err(_) => {
                move_out(dir, parent);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

fn move_out(dir: &Path, parent: &Path) {
    if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines() {
            let _ = fs::write(parent.join("cgroup.procs"), pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_controller_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let err = Quotas::create(dir.path(), "job", PERIOD_US).expect_err("no controller there");
        assert!(err.to_string().contains("no cgroup v1 cpu controller"), "{err}");
    }

    /// With the real controller (root on this machine), a process placed in
    /// a quota of 0.2 cores gets throttled, and everything is removed at the end.
    #[test]
    fn a_quota_throttles_a_busy_process_and_is_removed_afterwards() {
        let controller = Path::new(CPU_CONTROLLER);
        let Ok(mut quotas) = Quotas::create(controller, "unit-test", PERIOD_US) else {
            eprintln!("skipped: no writable cgroup v1 cpu controller");
            return;
        };
        let root = quotas.root().to_path_buf();
        let mut busy = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        quotas.place("i-1", 0.2, busy.id()).unwrap();
        let quota = fs::read_to_string(root.join("i-1/cpu.cfs_quota_us")).unwrap();
        assert_eq!(quota.trim(), "2000");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (periods, _) = quotas.throttled("i-1").expect("cpu.stat readable");
        assert!(periods > 0, "a busy loop in 0.2 cores is throttled");
        busy.kill().unwrap();
        busy.wait().unwrap();
        drop(quotas);
        assert!(!root.exists(), "the job's cgroup is removed");
    }

    #[test]
    fn a_quota_under_the_kernel_s_minimum_gets_a_longer_period_not_more_cpu() {
        assert_eq!(period_and_quota(0.45, PERIOD_US), (10_000, 4_500));
        // 1 ms periods: 0.6 and 0.3 cores need 1.667 and 3.334 ms.
        assert_eq!(period_and_quota(0.6, 1_000), (1_667, 1_000));
        assert_eq!(period_and_quota(0.3, 1_000), (3_334, 1_000));
        assert_eq!(period_and_quota(2.0, 1_000), (1_000, 2_000));
        for (cores, asked) in [(0.3, 1_000), (0.6, 2_000), (0.05, 10_000), (1.5, 1_000)] {
            let (period, quota) = period_and_quota(cores, asked);
            assert!(period >= asked && quota >= MIN_QUOTA_US, "{cores} cores over {asked} µs");
            let share = quota as f64 / period as f64;
            assert!((share - cores).abs() < 0.001, "{cores} cores over {asked} µs gave {share}");
        }
        // The kernel's longest period bounds a tiny share.
        assert_eq!(period_and_quota(0.0001, 1_000).0, MAX_PERIOD_US);
    }

    /// The period asked for is the one the kernel gets.
    #[test]
    fn an_instance_s_cgroup_gets_the_period_asked_for() {
        let Ok(mut quotas) = Quotas::create(Path::new(CPU_CONTROLLER), "unit-period", 2_000) else {
            eprintln!("skipped: no writable cgroup v1 cpu controller");
            return;
        };
        let root = quotas.root().to_path_buf();
        let mut idle = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        quotas.place("i-1", 0.3, idle.id()).unwrap();
        let read = |f: &str| fs::read_to_string(root.join("i-1").join(f)).unwrap().trim().to_string();
        assert_eq!((read("cpu.cfs_period_us"), read("cpu.cfs_quota_us")), ("3334".into(), "1000".into()));
        idle.kill().unwrap();
        idle.wait().unwrap();
    }
}
