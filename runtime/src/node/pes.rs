//! The PE threads of a node: one scheduler per local PE, pinned and bound
//! to its GPU, running its loop and, when a rescale stops it, the PE's part
//! of the rescale, until it exits.

use std::sync::Arc;
use std::time::Duration;

use ductile_coordinator::contract;

use super::env_var;
use super::shared::NodeShared;
use crate::pe::{LoopExit, PeCommand, Scheduler};
use crate::rescale::NodeEvent;

/// Starts one scheduler thread per local PE; the job's main chare starts on
/// global PE 0 when `main_here`. Returns the threads and their command
/// channels (a rescale's driver steers stopped PEs through them).
pub(super) fn start_pes(
    node: &Arc<NodeShared>,
    main_here: bool,
) -> (
    Vec<std::thread::JoinHandle<LoopExit>>,
    Vec<crossbeam_channel::Sender<PeCommand>>,
) {
    let topo = node.current_topology();
    let spin = Duration::from_micros(
        env_var("DUCTILE_SPIN_US")
            .and_then(|s| s.parse().ok())
            .unwrap_or(100),
    );
    let mut commands = Vec::new();
    let cpus = crate::affinity::allowed_cpus();
    let slot = env_var(contract::ENV_HOST_SLOT).and_then(|v| v.parse::<usize>().ok());
    let handles = (0..topo.local_pes() as usize)
        .map(|rank| {
            let (tx, rx) = crossbeam_channel::unbounded();
            commands.push(tx);
            let (node, topo, cpus) = (node.clone(), topo.clone(), cpus.clone());
            let pe_id = topo.local_pe(rank);
            std::thread::Builder::new()
                .name(format!("ductile-pe-{rank}"))
                .spawn(move || {
                    crate::gpu::bind_pe(rank);
                    let pes = topo.local_pes() as usize;
                    let mode = node.options.pe_affinity;
                    crate::affinity::pin_this_pe(rank, pes, &cpus, mode, slot);
                    let mut pe = Scheduler::new(node.clone(), topo, pe_id);
                    if pe_id == 0 && main_here {
                        match env_var(contract::ENV_RESTORE) {
                            Some(dir) => pe.restore(dir.into()),
                            None => pe.start_main(),
                        }
                    }
                    let inbox = &node.inboxes[rank];
                    let exit = loop {
                        match pe.run(inbox, spin) {
                            LoopExit::Stopped => match pe.rescale(inbox, &rx, &node.events) {
                                Some(exit) => break exit,
                                None => continue,
                            },
                            exit => break exit,
                        }
                    };
                    let _ = node.events.send(NodeEvent::Exited { rank, exit });
                    exit
                })
                .expect("spawning a PE thread")
        })
        .collect();
    (handles, commands)
}
