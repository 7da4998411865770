//! Instances on their own network (`network: namespaces`): one network
//! namespace per spot instance, joined to a bridge in the root namespace by
//! a veth pair, with an address in 10.200.0.0/16.
//!
//! The bridge holds 10.200.0.1: the coordinator, node 0 and its control
//! endpoint listen there (`ductile run --bind 10.200.0.1`), in the root
//! namespace, as on the on-demand instance of a real fleet. Every other
//! instance gets a namespace `dct<tag>-<instance>`, a veth pair whose root
//! end `dct<tag>h<slot>` is a port of the bridge `dct<tag>br`, and the
//! address `10.200.0.0/16` + slot. `<tag>` is a hash of the job's name, so
//! the names are the job's own, fit the 15-character limit of interface
//! names, and a crashed earlier run of the same job is found and removed.
//!
//! The launcher starts every node with the same program, so the driver puts
//! a small wrapper in front of it ([`WRAPPER_FILE`] in the state
//! directory): it `exec`s (same pid, which the launcher tracks) `ip netns
//! exec NS env DUCTILE_BIND=IP PROGRAM...`. It finds the namespace of a
//! launch member in `launch-<DUCTILE_LAUNCH_INDEX>` (none: the root
//! namespace) and that of a newcomer in `pid-<its pid>`, written by the
//! driver once the launcher's answer told it the pid.
//!
//! Terminating an instance takes its link down ([`Network::cut`]) before
//! its processes are killed, so its nodes lose the network as on a real
//! reclaim. Everything is removed when the [`Network`] is dropped.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The bridge's address: node 0, its control endpoint and the coordinator.
pub const BRIDGE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);

/// The prefix length of the instances' network, 10.200.0.0/16.
pub const PREFIX: u8 = 16;

/// The wrapper's file name in the state directory.
pub const WRAPPER_FILE: &str = "netns-node";

/// The directory (in the state directory) of the wrapper's slot files.
pub const SLOTS_DIR: &str = "netns";

/// The largest slot: 10.200.255.254 (10.200.255.255 is the broadcast).
const MAX_SLOT: u32 = 65_533;

/// Why instances cannot get their own network.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// Network namespaces cannot be made here (no `ip`, not root, no permission).
    #[error("network: namespaces cannot be used here: {0}")]
    Unavailable(String),
    /// An `ip` command failed.
    #[error("`ip {args}` failed: {stderr}")]
    Command {
        /// Its arguments.
        args: String,
        /// What it said.
        stderr: String,
    },
    /// A file of the wrapper could not be written.
    #[error("{}: {}", .0.display(), .1)]
    Io(PathBuf, std::io::Error),
    /// More instances than addresses in 10.200.0.0/16.
    #[error("no address left in 10.200.0.0/16 for instance {0}")]
    Exhausted(String),
}

/// A stable 24-bit hash of the job's name, as 6 hex digits (FNV-1a).
pub fn tag(job: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{:06x}", (h ^ (h >> 24) ^ (h >> 48)) & 0xff_ffff)
}

/// The job's bridge: `dct<tag>br` (11 characters).
pub fn bridge_name(job: &str) -> String {
    format!("dct{}br", tag(job))
}

/// The root end of slot `slot`'s veth pair: `dct<tag>h<slot>` (at most 15 characters).
pub fn veth_name(job: &str, slot: u32) -> String {
    format!("dct{}h{slot}", tag(job))
}

/// The namespace of an instance: `dct<tag>-<instance>`.
pub fn namespace_name(job: &str, instance: &str) -> String {
    format!("dct{}-{instance}", tag(job))
}

/// Slot `slot`'s address: 10.200.0.0 + slot + 1 (slot 0 is the bridge's
/// 10.200.0.1); `None` past the end of the network.
pub fn address(slot: u32) -> Option<Ipv4Addr> {
    if slot > MAX_SLOT {
        return None;
    }
    let host = slot + 1;
    Some(Ipv4Addr::new(10, 200, (host >> 8) as u8, (host & 0xff) as u8))
}

/// One instance's network.
#[derive(Clone, Debug, PartialEq)]
pub struct Attachment {
    /// Its slot (1 and up).
    pub slot: u32,
    /// Its namespace.
    pub namespace: String,
    /// The root end of its veth pair.
    pub veth: String,
    /// Its address.
    pub addr: Ipv4Addr,
}

/// The job's bridge and its instances' namespaces; removed on drop.
#[derive(Debug)]
pub struct Network {
    job: String,
    bridge: String,
    slots: PathBuf,
    wrapper: PathBuf,
    instances: BTreeMap<String, Attachment>,
    next_slot: u32,
}

/// Runs `ip ARGS`; its stderr on failure.
fn ip(args: &[&str]) -> Result<String, NetError> {
    let out = Command::new("ip").args(args).output().map_err(|e| NetError::Command {
        args: args.join(" "),
        stderr: e.to_string(),
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NetError::Command {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Whether network namespaces can be made here; why not otherwise.
pub fn available() -> Result<(), String> {
    if effective_uid().is_some_and(|uid| uid != 0) {
        return Err("it takes root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces; run as root or use network: loopback".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => {}
        Ok(_) | Err(_) => return Err("the `ip` command (iproute2) is not installed or does not run".into()),
    }
    ip(&["netns", "list"]).map(|_| ()).map_err(|e| e.to_string())
}

/// This process's effective uid, from /proc/self/status.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The names of the job's namespaces and links left by an earlier run.
fn leftovers(job: &str) -> (Vec<String>, Vec<String>) {
    let prefix = format!("dct{}", tag(job));
    let ns_prefix = format!("{prefix}-");
    let namespaces = ip(&["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&ns_prefix))
        .map(str::to_owned)
        .collect();
    // `ip -o link` lines: "7: name@peer: <FLAGS> ...".
    let links = ip(&["-o", "link", "show"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n))
        .filter(|n| n.starts_with(&prefix) && !n.starts_with(&ns_prefix))
        .map(str::to_owned)
        .collect();
    (namespaces, links)
}

/// Removes the job's namespaces and links (veths first, then the bridge).
fn remove_all(job: &str) {
    let (namespaces, mut links) = leftovers(job);
    let bridge = bridge_name(job);
    links.sort_by_key(|l| *l == bridge);
    for l in links {
        if let Err(e) = ip(&["link", "del", &l]) {
            tracing::warn!(link = %l, "cannot remove a link: {e}");
        }
    }
    for n in namespaces {
        if let Err(e) = ip(&["netns", "del", &n]) {
            tracing::warn!(namespace = %n, "cannot remove a network namespace: {e}");
        }
    }
}

/// Removes the namespaces and links a crashed earlier run of `job` left;
/// returns their names.
pub fn remove_leftovers(job: &str) -> Vec<String> {
    let old = remaining(job);
    if !old.is_empty() {
        remove_all(job);
    }
    old
}

/// The job's namespaces and links that exist now (for tests and checks).
pub fn remaining(job: &str) -> Vec<String> {
    let (mut n, l) = leftovers(job);
    n.extend(l);
    n
}

impl Network {
    /// Checks that namespaces can be made, removes what a crashed earlier
    /// run of `job` left, creates the bridge and writes the wrapper into
    /// `state_dir`.
    pub fn create(job: &str, state_dir: &Path) -> Result<Self, NetError> {
        available().map_err(NetError::Unavailable)?;
        let old = remove_leftovers(job);
        if !old.is_empty() {
            tracing::warn!(left = ?old, "removed what an earlier run of this job left");
        }
        let bridge = bridge_name(job);
        // 10.200.0.1 on another interface: another run (another job) holds the network.
        let addrs = ip(&["-o", "-4", "addr", "show"])?;
        let wanted = format!("inet {BRIDGE_ADDR}/");
        if let Some(line) = addrs.lines().find(|l| l.contains(&wanted)) {
            let name = line.split_whitespace().nth(1).unwrap_or("?");
            return Err(NetError::Unavailable(format!(
                "{BRIDGE_ADDR} is already on interface {name} (another `ductile cloud` with network: namespaces?); 10.200.0.0/16 serves one job at a time"
            )));
        }
        let state_dir = std::fs::canonicalize(state_dir).map_err(|e| NetError::Io(state_dir.to_owned(), e))?;
        let slots = state_dir.join(SLOTS_DIR);
        let wrapper = state_dir.join(WRAPPER_FILE);
        let net = Network {
            job: job.to_owned(),
            bridge: bridge.clone(),
            slots: slots.clone(),
            wrapper: wrapper.clone(),
            instances: BTreeMap::new(),
            next_slot: 1,
        };
        // From here on, a failure removes what was made (Drop).
        ip(&["link", "add", &bridge, "type", "bridge"]).map_err(|e| NetError::Unavailable(e.to_string()))?;
        ip(&["addr", "add", &format!("{BRIDGE_ADDR}/{PREFIX}"), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        if slots.exists() {
            std::fs::remove_dir_all(&slots).map_err(|e| NetError::Io(slots.clone(), e))?;
        }
        std::fs::create_dir_all(&slots).map_err(|e| NetError::Io(slots.clone(), e))?;
        let script = wrapper_script(&slots).ok_or_else(|| {
            NetError::Unavailable(format!("the state directory {} has a quote in its path", state_dir.display()))
        })?;
        std::fs::write(&wrapper, script).map_err(|e| NetError::Io(wrapper.clone(), e))?;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| NetError::Io(wrapper.clone(), e))?;
        Ok(net)
    }

    /// The wrapper the launcher runs as the job's program.
    pub fn wrapper(&self) -> &Path {
        &self.wrapper
    }

    /// The bridge's name.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// An instance's network, once it has one.
    pub fn attachment(&self, instance: &str) -> Option<&Attachment> {
        self.instances.get(instance)
    }

    /// Gives `instance` its namespace, veth pair and address.
    pub fn add(&mut self, instance: &str) -> Result<Attachment, NetError> {
        if let Some(a) = self.instances.get(instance) {
            return Ok(a.clone());
        }
        let slot = self.next_slot;
        let addr = address(slot).ok_or_else(|| NetError::Exhausted(instance.to_owned()))?;
        let a = Attachment {
            slot,
            namespace: namespace_name(&self.job, instance),
            veth: veth_name(&self.job, slot),
            addr,
        };
        self.next_slot += 1;
        // Recorded first, so that a half-made instance is removed too.
        self.instances.insert(instance.to_owned(), a.clone());
        let ns = a.namespace.as_str();
        ip(&["netns", "add", ns])?;
        ip(&["link", "add", &a.veth, "type", "veth", "peer", "name", "eth0", "netns", ns])?;
        ip(&["link", "set", &a.veth, "master", &self.bridge, "up"])?;
        ip(&["-n", ns, "addr", "add", &format!("{addr}/{PREFIX}"), "dev", "eth0"])?;
        ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        Ok(a)
    }

    /// Launch member `index` runs in `instance`'s namespace.
    pub fn assign_launch(&self, index: u32, instance: &str) -> Result<(), NetError> {
        self.write_slot(&format!("launch-{index}"), instance)
    }

    /// The newcomer process `pid` runs in `instance`'s namespace (its
    /// wrapper waits for this).
    pub fn assign_pid(&self, pid: u32, instance: &str) -> Result<(), NetError> {
        self.write_slot(&format!("pid-{pid}"), instance)
    }

    fn write_slot(&self, file: &str, instance: &str) -> Result<(), NetError> {
        let a = self
            .instances
            .get(instance)
            .ok_or_else(|| NetError::Unavailable(format!("instance {instance} has no namespace")))?;
        // Written whole, then renamed: the wrapper never reads half a line.
        let tmp = self.slots.join(format!(".{file}.tmp"));
        let path = self.slots.join(file);
        std::fs::write(&tmp, format!("{} {}\n", a.namespace, a.addr)).map_err(|e| NetError::Io(tmp.clone(), e))?;
        std::fs::rename(&tmp, &path).map_err(|e| NetError::Io(path, e))
    }

    /// Takes `instance`'s link down (the root end of its veth pair): its
    /// nodes can no longer send or receive anything.
    pub fn cut(&self, instance: &str) -> Result<bool, NetError> {
        match self.instances.get(instance) {
            Some(a) => ip(&["link", "set", &a.veth, "down"]).map(|_| true),
            None => Ok(false),
        }
    }

    /// Whether process `pid` runs in `instance`'s namespace (compares
    /// `/proc/PID/ns/net` with the namespace's file under /run/netns).
    pub fn runs_in(&self, pid: u32, instance: &str) -> Option<bool> {
        use std::os::unix::fs::MetadataExt;
        let a = self.instances.get(instance)?;
        let ns = std::fs::metadata(Path::new("/run/netns").join(&a.namespace)).ok()?;
        let proc = std::fs::metadata(format!("/proc/{pid}/ns/net")).ok()?;
        Some(ns.ino() == proc.ino() && ns.dev() == proc.dev())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Every veth (deleting one end deletes both), every namespace, the
        // bridge, and whatever else carries the job's tag.
        for a in self.instances.values() {
            let _ = ip(&["link", "del", &a.veth]);
            let _ = ip(&["netns", "del", &a.namespace]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
        remove_all(&self.job);
        let _ = std::fs::remove_dir_all(&self.slots);
        let _ = std::fs::remove_file(&self.wrapper);
    }
}

/// The wrapper: runs the node as the same process inside its instance's
/// namespace with `DUCTILE_BIND` at the instance's address. `None` when the
/// slots' path cannot be quoted simply.
pub fn wrapper_script(slots: &Path) -> Option<String> {
    let dir = slots.to_str().filter(|d| !d.contains('\''))?;
    Some(format!(
        r#"#!/bin/sh
# Written by `ductile cloud` (network: namespaces). Runs a node of the job in
# its instance's network namespace, as this same process (exec), bound to the
# instance's address. Removed at the end of the run.
dir='{dir}'
if [ -n "$DUCTILE_LAUNCH_INDEX" ]; then
  slot="$dir/launch-$DUCTILE_LAUNCH_INDEX"
  # No file: an instance in the root namespace (node 0's).
  [ -e "$slot" ] || exec "$@"
else
  # A newcomer: the driver names its namespace once it knows this pid.
  slot="$dir/pid-$$"
  waited=0
  while [ ! -e "$slot" ]; do
    waited=$((waited + 1))
    if [ "$waited" -gt 3000 ]; then
      echo "ductile cloud: no network namespace was assigned to newcomer pid $$ within 30 s" >&2
      exit 70
    fi
    sleep 0.01
  done
fi
read -r ns ip < "$slot"
exec ip netns exec "$ns" env "DUCTILE_BIND=$ip" "$@"
"#
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_jobs_own_and_fit_the_interface_limit() {
        assert_eq!(tag("demo"), tag("demo"), "stable");
        assert_ne!(tag("demo"), tag("demo2"));
        assert_eq!(tag("demo").len(), 6);
        let long = "a-very-long-job-name-that-goes-on-and-on";
        assert_eq!(bridge_name(long).len(), 11);
        assert!(veth_name(long, MAX_SLOT).len() <= 15, "{}", veth_name(long, MAX_SLOT));
        assert!(bridge_name("demo").starts_with("dct") && bridge_name("demo").ends_with("br"));
        assert_eq!(namespace_name("demo", "demo-2"), format!("dct{}-demo-2", tag("demo")));
        // A namespace never looks like one of the job's links (cleanup tells them apart).
        assert!(!bridge_name("demo").starts_with(&format!("dct{}-", tag("demo"))));
    }

    #[test]
    fn addresses_fill_the_network_after_the_bridge() {
        assert_eq!(address(1), Some(Ipv4Addr::new(10, 200, 0, 2)));
        assert_eq!(address(254), Some(Ipv4Addr::new(10, 200, 0, 255)));
        assert_eq!(address(255), Some(Ipv4Addr::new(10, 200, 1, 0)));
        assert_eq!(address(MAX_SLOT), Some(Ipv4Addr::new(10, 200, 255, 254)));
        assert_eq!(address(MAX_SLOT + 1), None, "10.200.255.255 is the broadcast");
        assert_eq!(address(0), Some(BRIDGE_ADDR));
    }

    #[test]
    fn the_wrapper_execs_in_the_namespace_and_refuses_unquotable_paths() {
        let s = wrapper_script(Path::new("/tmp/st/netns")).expect("plain path");
        assert!(s.starts_with("#!/bin/sh\n"));
        assert!(s.contains("dir='/tmp/st/netns'"));
        assert!(s.contains("exec ip netns exec \"$ns\" env \"DUCTILE_BIND=$ip\" \"$@\""));
        assert!(wrapper_script(Path::new("/tmp/it's")).is_none());
    }

    /// As root: a namespace and a link with the job's tag, as a crashed run
    /// leaves them, are found and removed; another job's are not touched.
    #[test]
    fn leftovers_of_a_crashed_run_are_removed_and_only_those() {
        if available().is_err() {
            eprintln!("skipped: {}", available().unwrap_err());
            return;
        }
        let (job, other) = ("unit-leftovers", "unit-other-job");
        let ns = namespace_name(job, "unit-leftovers-1");
        let link = veth_name(job, 7);
        let other_ns = namespace_name(other, "unit-other-job-1");
        // What an interrupted run of this test left.
        remove_leftovers(job);
        remove_leftovers(other);
        ip(&["netns", "add", &ns]).unwrap();
        ip(&["netns", "add", &other_ns]).unwrap();
        ip(&["link", "add", &link, "type", "bridge"]).unwrap();
        let mut found = remaining(job);
        found.sort();
        let mut expected = vec![ns.clone(), link.clone()];
        expected.sort();
        assert_eq!(found, expected);
        let mut removed = remove_leftovers(job);
        removed.sort();
        assert_eq!(removed, expected);
        assert!(remaining(job).is_empty());
        assert_eq!(remaining(other), vec![other_ns.clone()], "another job's namespace stays");
        ip(&["netns", "del", &other_ns]).unwrap();
    }

    /// The wrapper, run by hand: without a slot file a launch member runs
    /// in place; a newcomer waits for its pid's file.
    #[test]
    fn the_wrapper_runs_launch_members_without_a_slot_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let slots = dir.path().join("netns");
        std::fs::create_dir(&slots).unwrap();
        let wrapper = dir.path().join("w");
        std::fs::write(&wrapper, wrapper_script(&slots).unwrap()).unwrap();
        let out = Command::new("sh")
            .arg(&wrapper)
            .args(["echo", "in place"])
            .env("DUCTILE_LAUNCH_INDEX", "0")
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), "in place\n");
    }
}
