//! PE threads pinned to cores (`+pe-affinity`, as Charm++'s
//! `+setcpuaffinity`).
//!
//! Unpinned, the OS moves PE threads between cores, and a balancer that
//! measures per-PE speed sees noise instead of the machine (a hog sharing
//! one core looks like it moves around). Pinned, PE `i` of a node runs on
//! the `i`-th CPU the node may use.
//!
//! By default (`auto`) a node pins only when it has exactly a core per PE:
//! a dedicated cpuset (Kubernetes' static CPU manager with integer CPU
//! requests, `taskset`, a container with `--cpuset-cpus`). A node that sees
//! more CPUs than PEs shares the machine with others it cannot see, and
//! pinning every node's PE 0 to the first CPU would pile them up there.
//! Nodes of one job that share a machine (the local fleet) each see every
//! CPU of it: their launcher numbers them (`DUCTILE_HOST_SLOT`), and node
//! `k` pins its PE `i` to the `(i + k) mod n`-th CPU. Without it, `ductile
//! run --nodes 2 --pes-per-node 2` on 2 cores put both nodes' PE 0 on CPU 0,
//! and a message between them waited for the other to yield the core.

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use tracing::{debug, info, warn};

/// When PE threads are pinned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Affinity {
    /// Pin when the node has exactly one CPU per PE.
    #[default]
    Auto,
    /// Always pin, PE `i` to allowed CPU `i mod n`.
    On,
    /// Never pin.
    Off,
}

impl std::str::FromStr for Affinity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Affinity::Auto),
            "on" | "true" | "1" => Ok(Affinity::On),
            "off" | "false" | "0" => Ok(Affinity::Off),
            other => Err(format!("+pe-affinity: `{other}` is not on, off or auto")),
        }
    }
}

/// The CPU PE `rank` of `pes` is pinned to, given the CPUs the node may
/// use and, when other nodes of the job share them, the node's number
/// among them (`slot`).
pub fn cpu_for(
    rank: usize,
    pes: usize,
    allowed: &[usize],
    mode: Affinity,
    slot: Option<usize>,
) -> Option<usize> {
    if allowed.is_empty() {
        return None;
    }
    let at = rank.wrapping_add(slot.unwrap_or(0)) % allowed.len();
    match mode {
        Affinity::Off => None,
        Affinity::Auto if allowed.len() != pes => None,
        Affinity::Auto | Affinity::On => Some(allowed[at]),
    }
}

/// The CPUs this process may run on (read once, before any PE is pinned).
pub fn allowed_cpus() -> Vec<usize> {
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(e) => {
            debug!("cannot read this process's CPU set: {e}");
            Vec::new()
        }
    }
}

/// Pins the calling PE thread as `mode` says.
pub fn pin_this_pe(
    rank: usize,
    pes: usize,
    allowed: &[usize],
    mode: Affinity,
    slot: Option<usize>,
) {
    let Some(cpu) = cpu_for(rank, pes, allowed, mode, slot) else {
        debug!(
            rank,
            cpus = allowed.len(),
            pes,
            ?mode,
            ?slot,
            "PE thread not pinned"
        );
        return;
    };
    let mut set = CpuSet::new();
    if let Err(e) = set
        .set(cpu)
        .and_then(|()| sched_setaffinity(Pid::from_raw(0), &set))
    {
        warn!(rank, cpu, "cannot pin the PE thread: {e}");
        return;
    }
    info!(rank, cpu, ?slot, "PE thread pinned to CPU {cpu}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_pins_only_with_a_core_per_pe_from_the_node_s_slot_on() {
        assert_eq!(cpu_for(1, 2, &[4, 5], Affinity::Auto, None), Some(5));
        assert_eq!(
            cpu_for(1, 2, &[0, 1, 2, 3], Affinity::Auto, None),
            None,
            "shares the machine"
        );
        // Two nodes of 2 PEs on 2 CPUs: each uses both, PE 0 of each
        // on a CPU of its own.
        let layout: Vec<_> = [0, 1]
            .iter()
            .map(|&slot| {
                (0..2)
                    .map(|r| cpu_for(r, 2, &[0, 1], Affinity::Auto, Some(slot)))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(layout, [[Some(0), Some(1)], [Some(1), Some(0)]]);
        assert_eq!(
            cpu_for(3, 4, &[0, 1], Affinity::On, None),
            Some(1),
            "on: round robin"
        );
        assert_eq!(cpu_for(0, 4, &[0, 1], Affinity::On, Some(3)), Some(1));
        assert_eq!(cpu_for(0, 2, &[0, 1], Affinity::Off, None), None);
        assert_eq!(cpu_for(0, 1, &[], Affinity::On, None), None);
        assert_eq!("auto".parse::<Affinity>(), Ok(Affinity::Auto));
        assert!("sometimes".parse::<Affinity>().is_err());
    }

    #[test]
    fn this_process_can_read_its_cpus() {
        assert!(!allowed_cpus().is_empty());
    }
}
