//! The CPU a node may use under its cgroup's CFS quota: what a Kubernetes
//! container's CPU limit and the local cloud's instance speeds
//! (`operator/src/cloud/cgroup.rs`) both come down to.
//!
//! A quota does not make a core slower, it takes it away for part of every
//! period, so timing a short kernel (`pe/balance.rs`'s calibration) runs
//! between throttlings and sees the whole core. The rate-aware balancer
//! needs the share the PE really gets: the calibrated speed times
//! [`pe_share`], the node's quota in cores spread over its PEs (at most one
//! core each). It depends on the configuration only, not on how busy the PE
//! was (a share measured from CPU time over wall time does, and fed back
//! into the placement, docs/benchmarks.md).
//!
//! Read from `/proc/self/cgroup` and the cgroup file system: cgroup v1's
//! `cpu.cfs_quota_us` over `cpu.cfs_period_us` (the `cpu` controller's
//! mount), or v2's `cpu.max`; the smallest quota of the node's group and its
//! ancestors. No quota, or nothing readable: `None`, and speeds are not
//! scaled.

use std::fs;
use std::path::{Path, PathBuf};

/// Where cgroup file systems are mounted on Linux distributions.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The share of a core each of a node's `pes` PEs may use under the
/// process's CPU quota: `quota / pes`, at most 1; 1 without a quota.
pub(crate) fn pe_share(pes: u32) -> f64 {
    share(quota_cores(Path::new(CGROUP_ROOT)), pes)
}

fn share(quota: Option<f64>, pes: u32) -> f64 {
    match quota {
        Some(cores) if pes > 0 => (cores / pes as f64).min(1.0),
        _ => 1.0,
    }
}

/// Cores this process may use under its cgroup's quota (None: no quota).
fn quota_cores(root: &Path) -> Option<f64> {
    let groups = fs::read_to_string("/proc/self/cgroup").ok()?;
    quota_in(root, &groups)
}

/// The quota of the group that `groups` (the text of `/proc/PID/cgroup`)
/// names, under the cgroup file systems mounted at `root`.
fn quota_in(root: &Path, groups: &str) -> Option<f64> {
    for line in groups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "cpu") {
            // v1: the cpu controller's own hierarchy.
            for mount in ["cpu", "cpu,cpuacct", "cpuacct,cpu"] {
                let base = root.join(mount);
                if base.join("cpu.cfs_quota_us").exists() {
                    return smallest_up(&base, path, v1_quota);
                }
            }
        } else if controllers.is_empty() && root.join("cgroup.controllers").exists() {
            // v2: the unified hierarchy.
            return smallest_up(root, path, v2_quota);
        }
    }
    None
}

/// The smallest quota of the group `path` under `base` and its ancestors.
fn smallest_up(base: &Path, path: &str, read: fn(&Path) -> Option<f64>) -> Option<f64> {
    let mut dir: PathBuf = base.join(path);
    let mut smallest: Option<f64> = None;
    loop {
        if let Some(q) = read(&dir) {
            smallest = Some(smallest.map_or(q, |s| s.min(q)));
        }
        if dir == base || !dir.pop() || !dir.starts_with(base) {
            return smallest;
        }
    }
}

/// v1: `cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us`.
fn v1_quota(dir: &Path) -> Option<f64> {
    let read = |f: &str| {
        fs::read_to_string(dir.join(f))
            .ok()?
            .trim()
            .parse::<i64>()
            .ok()
    };
    let (quota, period) = (read("cpu.cfs_quota_us")?, read("cpu.cfs_period_us")?);
    (quota > 0 && period > 0).then(|| quota as f64 / period as f64)
}

/// v2: `cpu.max`, "QUOTA PERIOD" or "max PERIOD".
fn v2_quota(dir: &Path) -> Option<f64> {
    let text = fs::read_to_string(dir.join("cpu.max")).ok()?;
    let mut f = text.split_whitespace();
    let (quota, period) = (
        f.next()?.parse::<f64>().ok()?,
        f.next()?.parse::<f64>().ok()?,
    );
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, text: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn a_v1_quota_is_the_smallest_of_the_group_and_its_ancestors() {
        let root = tempfile::tempdir().unwrap();
        let cpu = root.path().join("cpu,cpuacct");
        write(&cpu, "cpu.cfs_quota_us", "-1\n");
        write(&cpu, "cpu.cfs_period_us", "100000\n");
        let job = cpu.join("ductile-j-1");
        write(&job, "cpu.cfs_quota_us", "-1\n");
        write(&job, "cpu.cfs_period_us", "100000\n");
        let inst = job.join("i-2");
        write(&inst, "cpu.cfs_quota_us", "6000\n");
        write(&inst, "cpu.cfs_period_us", "10000\n");
        let groups = "12:memory:/x\n4:cpu,cpuacct:/ductile-j-1/i-2\n0::/y\n";
        assert_eq!(quota_in(root.path(), groups), Some(0.6));
        // The parent limits more: its quota counts.
        write(&job, "cpu.cfs_quota_us", "25000\n");
        assert_eq!(quota_in(root.path(), groups), Some(0.25));
        // A group with no quota anywhere above it.
        let groups = "4:cpu,cpuacct:/\n";
        assert_eq!(quota_in(root.path(), groups), None);
    }

    #[test]
    fn a_v2_quota_is_read_from_cpu_max() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "cgroup.controllers", "cpu memory\n");
        write(root.path(), "cpu.max", "max 100000\n");
        let pod = root.path().join("kubepods/pod1");
        write(&pod, "cpu.max", "150000 100000\n");
        assert_eq!(quota_in(root.path(), "0::/kubepods/pod1\n"), Some(1.5));
        write(&pod, "cpu.max", "max 100000\n");
        assert_eq!(quota_in(root.path(), "0::/kubepods/pod1\n"), None);
    }

    #[test]
    fn the_share_is_the_quota_over_the_pes_and_at_most_a_core() {
        assert_eq!(share(Some(0.6), 2), 0.3);
        assert_eq!(share(Some(3.0), 2), 1.0);
        assert_eq!(share(None, 4), 1.0);
        assert_eq!(share(Some(0.5), 0), 1.0);
    }
}
