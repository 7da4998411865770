//! A PE's part in a checkpoint and in a restore (see [`crate::checkpoint`]).
//!
//! Checkpoint, driven by PE 0: the control endpoint's request waits for the
//! next `at_sync` of any array ([`PeState::checkpoint_at_sync`]), then for
//! quiescence; every PE checks that it holds no application message and
//! writes a snapshot of its chares (they stay where they are); PE 0 writes
//! the job's file and answers. The job then ends with
//! [`EXIT_CHECKPOINTED`] or goes on with the load-balancing step it was
//! about to run.
//!
//! Restore, on PE 0 of a job started with `DUCTILE_RESTORE`: instead of
//! running main it re-creates main and every collection from the files,
//! sends each chare to a PE of the new job (array elements round-robin by
//! their old PE, group and nodegroup members to the same PE or node when it
//! still exists), waits until every PE has them, and runs the interrupted
//! step, which balances (with `+lb-rescale`'s strategy, as after a
//! rescale) and resumes the elements; with `+lb-restore off` it resumes
//! them where the restore put them (the papers' restart without
//! rebalancing).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ductile_coordinator::contract::EXIT_CHECKPOINTED;
use ductile_coordinator::control::CheckpointReport;
use ductile_coordinator::proto::NodeId;
use tracing::{error, info, warn};

use super::reduction::Population;
use super::{misrouted, PeState, Scheduler};
use crate::checkpoint::{
    job_path, pe_path, read, write, CheckpointError, JobFile, PeFile, SavedChare, SavedPopulation,
};
use crate::collection::StoreError;
use crate::msg::{CallbackSpec, CollId, Dest, IndexKey, Target, MAIN_COLL};
use crate::node::EXIT_STARTUP;
use crate::reduce::Value;
use crate::system::{AdoptedColl, Adoption, ElemMeta, Shape, SysMsg};

/// Why a restarted job cannot restore from its checkpoint.
#[derive(Debug, thiserror::Error)]
enum RestoreError {
    /// A file of the checkpoint cannot be used.
    #[error(transparent)]
    File(#[from] CheckpointError),
    /// The program registers no main chare to restore.
    #[error("no main chare registered")]
    NoMain,
    /// The main chare's saved state does not unpack.
    #[error("the main chare: {0}")]
    Main(StoreError),
    /// A saved chare names a collection the job file does not list.
    #[error("chare of an unknown collection {0:#x}")]
    UnknownCollection(CollId),
}

/// The checkpoint service's state (PE 0's; other PEs only answer).
#[derive(Default)]
pub(super) struct Checkpointing {
    /// Root: the checkpoint being taken.
    pub(super) taking: Option<RootCheckpoint>,
    /// Root: the restore in progress.
    pub(super) restoring: Option<RootRestore>,
}

/// PE 0's bookkeeping of the checkpoint being taken.
#[derive(Default)]
pub(crate) struct RootCheckpoint {
    /// The array whose sync point it waits at (set once one arrived).
    synced: Option<CollId>,
    written: u32,
    chares: u64,
    bytes: u64,
    failures: Vec<String>,
}

/// PE 0's bookkeeping of a restore.
pub(crate) struct RootRestore {
    pub(super) source: RestoreSource,
    pub(super) synced: CollId,
    pub(super) acks: u32,
    pub(super) chares: u64,
    pub(super) started: Instant,
    pub(super) placed_ms: f64,
}

/// A recovery in progress (the restore's source), for its report.
pub(crate) struct Recovery {
    /// The lost node, numbered in the view it was lost from.
    pub node: NodeId,
    pub uid: u64,
    /// The checkpoint rolled back to.
    pub ckpt: u64,
    /// When the loss was noticed on node 0.
    pub noticed: Instant,
    /// The load-balancing step the checkpoint's sync point was for.
    pub step: u64,
    /// A checkpoint that was being taken when the node was lost (the
    /// previous complete one was used).
    pub interrupted: Option<u64>,
    /// The epoch the checkpoint was taken in, when rescales or recoveries
    /// came since.
    pub carried_from: Option<u64>,
    /// Newcomer nodes the recovery's commit admitted.
    pub admitted: u32,
}

/// Where a restore's chares come from.
pub(crate) enum RestoreSource {
    /// A restarted job's checkpoint directory.
    Dir(PathBuf),
    /// A recovery's buddy checkpoint (`pe/buddy.rs`), in memory.
    Recovery(Recovery),
}

impl PeState {
    /// Root: the control endpoint queued a checkpoint.
    pub(super) fn checkpoint_begin(&mut self) {
        if self.rescaling.root.is_some() {
            self.checkpoint_answer(Err(CheckpointError::Rescaling));
            return;
        }
        self.ckpt.taking = Some(RootCheckpoint::default());
        info!("checkpoint requested: waiting for the next sync point");
    }

    /// Root: every element of `coll` is at sync. Returns whether a waiting
    /// checkpoint took the sync point (its step runs after the checkpoint).
    pub(super) fn checkpoint_at_sync(&mut self, coll: CollId) -> bool {
        if self.ckpt.taking.is_some() && self.node.operation.with_checkpoint(|_| ()).is_none() {
            info!("the checkpoint request was withdrawn before a sync point came");
            self.ckpt.taking = None;
        }
        match &mut self.ckpt.taking {
            Some(c) if c.synced.is_none() => c.synced = Some(coll),
            _ => return false,
        }
        // Quiescence: nothing of the application queued or in flight.
        self.send_sys(
            0,
            SysMsg::QdStart {
                callback: CallbackSpec {
                    target: Target::Checkpoint { coll },
                    prefix: Vec::new(),
                },
            },
        );
        true
    }

    /// Root: the job is quiescent; every PE writes its chares.
    pub(super) fn checkpoint_quiescent(&mut self, coll: CollId) {
        let dir = self.node.operation.with_checkpoint(|d| {
            d.writing_from = Some(Instant::now());
            d.dir.to_string_lossy().into_owned()
        });
        let Some(dir) = dir else {
            info!("the checkpoint request was withdrawn; resuming {coll:#x}");
            self.ckpt.taking = None;
            self.lb_start(coll, false, Vec::new());
            return;
        };
        for pe in 0..self.num_pes() {
            self.send_sys(pe, SysMsg::CheckpointWrite { dir: dir.clone() });
        }
    }

    pub(super) fn checkpoint_answer(&mut self, result: Result<CheckpointReport, CheckpointError>) {
        if let Some(desk) = self.node.operation.take_checkpoint_if(|_| true) {
            let _ = desk.reply.send(result);
        }
    }

    /// What this PE holds that a checkpoint cannot capture: application
    /// messages waiting anywhere, reductions under way.
    pub(super) fn unsettled(&self) -> Option<String> {
        let queued = self
            .queue
            .fifo
            .iter()
            .chain(self.queue.heap.iter().map(|q| &q.env))
            .filter(|e| !matches!(e.dest, Dest::System))
            .count();
        let held = self.loc.unknown.values().map(Vec::len).sum::<usize>()
            + self.loc.waiting.values().map(Vec::len).sum::<usize>()
            + self.startup.held_in.len();
        if queued + held > 0 || !self.red.gathered.is_empty() {
            Some(format!(
                "PE {} is not settled: {queued} queued and {held} held messages, {} partial reductions",
                self.pe,
                self.red.gathered.len()
            ))
        } else {
            None
        }
    }
}

impl Scheduler {
    /// The checkpoint service's runtime messages.
    pub(super) fn on_checkpoint(&mut self, msg: SysMsg) {
        match msg {
            SysMsg::CheckpointBegin => self.ctx.checkpoint_begin(),
            SysMsg::CheckpointWrite { dir } => self.checkpoint_write(&dir),
            SysMsg::CheckpointWritten { pe, result } => self.checkpoint_written(pe, result),
            SysMsg::Restore {
                coll,
                key,
                state,
                meta,
            } => self.restore_chare(coll, key, &state, meta),
            SysMsg::RestoreSent => self.ctx.send_sys(0, SysMsg::RestoreAck),
            SysMsg::RestoreAck => self.restore_acked(),
            other => misrouted(self.ctx.pe, "checkpoint", &other),
        }
    }

    /// Every PE: snapshot every chare here (main excepted: PE 0 writes it
    /// with the job's file) to `dir/pe-<N>.ckpt`.
    pub(super) fn checkpoint_write(&mut self, dir: &str) {
        let me = self.ctx.pe;
        let result = match self.ctx.unsettled() {
            Some(why) => Err(why),
            None => {
                let file = PeFile {
                    pe: me,
                    node: self.ctx.topo.my_node(),
                    chares: self.snapshot_chares(&mut Vec::new()),
                };
                let n = file.chares.len() as u64;
                write(&pe_path(Path::new(dir), me), &file)
                    .map(|bytes| (n, bytes))
                    .map_err(|e| e.to_string())
            }
        };
        self.ctx
            .send_sys(0, SysMsg::CheckpointWritten { pe: me, result });
    }

    /// Every chare here but main, as saved, in a fixed order (collection,
    /// then key); they stay where they are. Each chare's state is packed into a buffer taken from `spare`
    /// (emptied first) while there are any, else into a new one.
    pub(super) fn snapshot_chares(&self, spare: &mut Vec<Vec<u8>>) -> Vec<SavedChare> {
        let mut colls: Vec<CollId> = self
            .stores
            .keys()
            .copied()
            .filter(|&c| c != MAIN_COLL)
            .collect();
        colls.sort_unstable();
        let mut chares = Vec::new();
        for coll in colls {
            let store = &self.stores[&coll];
            let mut keys: Vec<IndexKey> = store.locals().into_iter().map(|(k, _)| k).collect();
            keys.sort_unstable();
            for key in keys {
                let mut state = spare.pop().unwrap_or_default();
                state.clear();
                match store.snapshot_into(key, &mut state) {
                    Some(meta) => chares.push(SavedChare {
                        coll,
                        key,
                        state: crate::Bulk(state),
                        meta,
                    }),
                    None => spare.push(state),
                }
            }
        }
        chares
    }

    /// Root: one PE's files are written (or not).
    pub(super) fn checkpoint_written(&mut self, pe: u32, result: Result<(u64, u64), String>) {
        let npes = self.ctx.num_pes();
        let Some(c) = self.ctx.ckpt.taking.as_mut() else {
            warn!("a checkpoint report from PE {pe} with no checkpoint under way");
            return;
        };
        c.written += 1;
        match result {
            Ok((chares, bytes)) => {
                c.chares += chares;
                c.bytes += bytes;
            }
            Err(e) => c.failures.push(e),
        }
        if c.written < npes {
            return;
        }
        let c = self.ctx.ckpt.taking.take().expect("checked");
        let synced = c.synced.expect("a checkpoint writes at a sync point");
        let outcome = if c.failures.is_empty() {
            self.write_job_file(synced)
                .map(|bytes| (c.chares + 1, c.bytes + bytes))
        } else {
            Err(CheckpointError::Pes(c.failures.join("; ")))
        };
        let (started, writing_from, dir, exit) = {
            let desk = self.ctx.node.operation.with_checkpoint(|d| {
                (
                    d.started,
                    d.writing_from.unwrap_or(d.started),
                    d.dir.clone(),
                    d.exit,
                )
            });
            // Nobody waits for it: go on from the sync point.
            desk.unwrap_or_else(|| (Instant::now(), Instant::now(), PathBuf::new(), false))
        };
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let report = outcome.map(|(chares, bytes)| CheckpointReport {
            epoch: self.ctx.topo.epoch(),
            pes: npes,
            chares,
            bytes,
            wait_ms: (writing_from - started).as_secs_f64() * 1e3,
            write_ms: ms(writing_from),
            total_ms: ms(started),
        });
        match &report {
            Ok(r) => {
                info!(dir = %dir.display(), chares = r.chares, bytes = r.bytes, "checkpoint written")
            }
            Err(e) => error!("checkpoint failed: {e}"),
        }
        let ok = report.is_ok();
        self.ctx.checkpoint_answer(report);
        if ok && exit {
            self.ctx.exit(EXIT_CHECKPOINTED);
        } else {
            // Go on: run the step whose sync point the checkpoint took.
            self.ctx.lb_start(synced, false, Vec::new());
        }
    }

    fn write_job_file(&mut self, synced: CollId) -> Result<u64, CheckpointError> {
        let dir = self
            .ctx
            .node
            .operation
            .with_checkpoint(|d| d.dir.clone())
            .ok_or(CheckpointError::Withdrawn)?;
        let job = self.job_snapshot(synced)?;
        write(&job_path(&dir), &job)
    }

    /// Root: what only PE 0 holds (main, readonly values, collections,
    /// populations, counters), at the sync point of `synced`.
    pub(super) fn job_snapshot(&self, synced: CollId) -> Result<JobFile, CheckpointError> {
        let (state, meta) = self
            .stores
            .get(&MAIN_COLL)
            .and_then(|s| s.snapshot(0))
            .ok_or(CheckpointError::NoMain)?;
        let reg = self.ctx.node.registry.clone();
        let mut readonly: Vec<(u64, Vec<u8>)> = self
            .ctx
            .startup
            .readonly
            .iter()
            .map(|(id, v)| (*id, (reg.readonlies[id].encode)(&**v)))
            .collect();
        readonly.sort_unstable_by_key(|(id, _)| *id);
        let mut populations = Vec::new();
        for (&coll, p) in &self.ctx.red.populations {
            if !p.done.is_empty() {
                return Err(CheckpointError::Unsettled(format!(
                    "collection {coll:#x} has reduction results waiting"
                )));
            }
            populations.push((
                coll,
                SavedPopulation {
                    base: p.base,
                    births: p.births.clone(),
                    next_open: p.next_open,
                },
            ));
        }
        populations.sort_unstable_by_key(|(c, _)| *c);
        fn sorted<'a>(m: impl IntoIterator<Item = (&'a CollId, &'a u64)>) -> Vec<(CollId, u64)> {
            let mut v: Vec<(CollId, u64)> = m.into_iter().map(|(c, n)| (*c, *n)).collect();
            v.sort_unstable();
            v
        }
        let mut broadcasts = sorted(&self.ctx.loc.next_bcast);
        for (coll, store) in &self.stores {
            if let Some(b) = broadcasts.iter_mut().find(|(c, _)| c == coll) {
                b.1 = b.1.max(store.last_broadcast());
            }
        }
        Ok(JobFile {
            pes: self.ctx.num_pes(),
            nodes: self.ctx.topo.num_nodes(),
            readonly,
            specs: self.ctx.loc.specs.clone(),
            populations,
            broadcasts,
            lb_steps: sorted(&self.ctx.lb.steps),
            synced,
            main: SavedChare {
                coll: MAIN_COLL,
                key: 0,
                state: crate::Bulk(state),
                meta,
            },
            rescale_callbacks: self.ctx.rescaling.callbacks.clone(),
        })
    }

    /// PE 0 of a restarted job: everything main would have done, from the files.
    pub(crate) fn restore(&mut self, dir: PathBuf) {
        match self.try_restore(&dir) {
            Ok(()) => {}
            Err(e) => {
                error!("cannot restore from {}: {e}", dir.display());
                self.ctx.exit(EXIT_STARTUP);
            }
        }
    }

    fn try_restore(&mut self, dir: &Path) -> Result<(), RestoreError> {
        let started = Instant::now();
        let job: JobFile = read(&job_path(dir))?;
        let files: Vec<PeFile> = (0..job.pes)
            .map(|pe| read::<PeFile>(&pe_path(dir, pe)))
            .collect::<Result<_, _>>()?;
        let reg = self.ctx.node.registry.clone();
        let main_type = reg.main_type.ok_or(RestoreError::NoMain)?;
        let entry = reg.chares.get(&main_type).expect("main type is registered");
        let mut main = (entry.make)(MAIN_COLL);
        main.unpack(0, &job.main.state, job.main.meta.clone(), &mut self.ctx)
            .map_err(RestoreError::Main)?;
        self.stores.insert(MAIN_COLL, main);

        let topo = self.ctx.topo.clone();
        let (pes, nodes) = (topo.num_pes(), topo.num_nodes());
        self.ctx.loc.specs = job.specs.clone();
        self.ctx.rescaling.callbacks = job.rescale_callbacks.clone();
        self.ctx.loc.next_bcast = job.broadcasts.iter().copied().collect();
        self.ctx.lb.steps = job.lb_steps.iter().copied().collect();
        let mut populations: BTreeMap<CollId, Population> = job
            .populations
            .into_iter()
            .map(|(c, p)| {
                (
                    c,
                    Population {
                        base: p.base,
                        births: p.births,
                        next_open: p.next_open,
                        done: BTreeMap::new(),
                    },
                )
            })
            .collect();

        // Where each chare goes, and the members that do not come back.
        let shapes: BTreeMap<CollId, Shape> = job
            .specs
            .iter()
            .map(|s| (s.coll, s.shape.clone()))
            .collect();
        let mut sends: Vec<(u32, SavedChare)> = Vec::new();
        let mut restored_members: BTreeMap<CollId, Vec<u32>> = BTreeMap::new();
        let mut pe0_next: BTreeMap<CollId, u32> = BTreeMap::new();
        for file in files {
            for c in file.chares {
                let target = match shapes.get(&c.coll) {
                    Some(Shape::Array { .. }) => Some(file.pe % pes),
                    Some(Shape::Group) => (file.pe < pes).then_some(file.pe),
                    Some(Shape::NodeGroup) => (file.node < nodes).then(|| topo.first_pe(file.node)),
                    None => return Err(RestoreError::UnknownCollection(c.coll)),
                };
                if !matches!(shapes[&c.coll], Shape::Array { .. }) {
                    if file.pe == 0 {
                        pe0_next.insert(c.coll, c.meta.next_red);
                    }
                    match target {
                        Some(pe) => restored_members.entry(c.coll).or_default().push(pe),
                        // A member whose PE or node is gone: it owes nothing more.
                        None => {
                            if let Some(p) = populations.get_mut(&c.coll) {
                                *p.births.entry(c.meta.next_red).or_insert(0) -= 1;
                            }
                        }
                    }
                }
                if let Some(pe) = target {
                    sends.push((pe, c));
                }
            }
        }

        // New members (more PEs or nodes than before) join like newcomers.
        let mut red_start: BTreeMap<CollId, u32> = BTreeMap::new();
        for spec in &job.specs {
            let (now, before) = match spec.shape {
                Shape::Group => (pes, job.pes),
                Shape::NodeGroup => (nodes, job.nodes),
                Shape::Array { .. } => continue,
            };
            if let Some(p) = populations.get_mut(&spec.coll) {
                let start = pe0_next
                    .get(&spec.coll)
                    .copied()
                    .unwrap_or(p.next_open)
                    .max(p.next_open);
                if now > before {
                    *p.births.entry(start).or_insert(0) += (now - before) as i64;
                }
                red_start.insert(spec.coll, start);
            }
        }
        self.ctx.red.populations = populations.into_iter().collect();

        let broadcasts: BTreeMap<CollId, u64> = job.broadcasts.iter().copied().collect();
        for pe in 0..pes {
            let colls = job
                .specs
                .iter()
                .map(|spec| AdoptedColl {
                    spec: spec.clone(),
                    last_bcast: broadcasts.get(&spec.coll).copied().unwrap_or(0),
                    red_start: red_start.get(&spec.coll).copied().unwrap_or(0),
                    skip_members: restored_members
                        .get(&spec.coll)
                        .is_some_and(|m| m.contains(&pe)),
                })
                .collect();
            self.ctx.send_sys(
                pe,
                SysMsg::Adopt(Adoption {
                    readonly: job.readonly.clone(),
                    colls,
                }),
            );
        }
        let chares = sends.len() as u64 + 1;
        for (pe, c) in sends {
            self.ctx.send_sys(
                pe,
                SysMsg::Restore {
                    coll: c.coll,
                    key: c.key,
                    state: c.state,
                    meta: c.meta,
                },
            );
        }
        for pe in 0..pes {
            self.ctx.send_sys(pe, SysMsg::RestoreSent);
        }
        info!(
            from_pes = job.pes,
            pes,
            chares,
            "restoring the job from {}",
            dir.display()
        );
        self.ctx.ckpt.restoring = Some(RootRestore {
            source: RestoreSource::Dir(dir.to_path_buf()),
            synced: job.synced,
            acks: 0,
            chares,
            started,
            placed_ms: 0.0,
        });
        Ok(())
    }

    /// Any PE: a checkpointed chare arrived; it replaces a member built here.
    pub(super) fn restore_chare(
        &mut self,
        coll: CollId,
        key: IndexKey,
        state: &[u8],
        meta: ElemMeta,
    ) {
        let Some(store) = self.stores.get_mut(&coll) else {
            error!(
                pe = self.ctx.pe,
                "a restored chare of an unknown collection {coll:#x} was lost"
            );
            return;
        };
        if store.has(key) {
            let _ = store.pack(key);
        }
        if let Err(e) = store.unpack(key, state, meta, &mut self.ctx) {
            error!(
                pe = self.ctx.pe,
                "a restored chare of {} was lost: {e}",
                self.coll_name(coll)
            );
        }
    }

    /// Root: one more PE holds everything sent to it.
    pub(super) fn restore_acked(&mut self) {
        let pes = self.ctx.num_pes();
        let Some(r) = self.ctx.ckpt.restoring.as_mut() else {
            return;
        };
        r.acks += 1;
        if r.acks < pes {
            return;
        }
        r.placed_ms = r.started.elapsed().as_secs_f64() * 1e3;
        let synced = r.synced;
        if !self.ctx.node.options.lb_restore {
            // `+lb-restore off`: no step; the elements resume where they are.
            let step = self.ctx.lb.steps.get(&synced).copied().unwrap_or(0);
            self.ctx
                .send_sys(0, SysMsg::LbResume { coll: synced, step });
            self.restore_balanced(synced, 0);
            return;
        }
        // The step the checkpoint interrupted: spreads and resumes the elements.
        self.ctx.lb_start(synced, false, Vec::new());
        if let Some(root) = self.ctx.lb.roots.get_mut(&synced) {
            root.restore = true;
        }
    }

    /// Root: the first step after a restore ended (it moved `migrations`
    /// elements; none without a step); the job runs again.
    pub(super) fn restore_balanced(&mut self, coll: CollId, migrations: u64) {
        let Some(r) = self.ctx.ckpt.restoring.take_if(|r| r.synced == coll) else {
            return;
        };
        let total_ms = r.started.elapsed().as_secs_f64() * 1e3;
        // The job runs at its new size: tell the program, as a live rescale does.
        let pes = self.ctx.num_pes();
        for cb in self.ctx.rescaling.callbacks.clone() {
            self.ctx.deliver_callback(&cb, &Value::U32(pes));
        }
        let dir = match r.source {
            RestoreSource::Dir(dir) => dir,
            RestoreSource::Recovery(recovery) => {
                self.ctx.recovered(recovery, r.chares, r.placed_ms, total_ms, migrations);
                return;
            }
        };
        info!(
            chares = r.chares,
            placed_ms = r.placed_ms,
            total_ms,
            "job restored"
        );
        let record = serde_json::json!({
            "pes": self.ctx.num_pes(),
            "chares": r.chares,
            "place_ms": r.placed_ms,
            "balance_ms": total_ms - r.placed_ms,
            "total_ms": total_ms,
            "balanced": self.ctx.node.options.lb_restore,
            "migrations": migrations,
        });
        let path = dir.join("restored.json");
        if let Err(e) = crate::files::write_atomically(&path, record.to_string()) {
            warn!("cannot write {}: {e}", path.display());
        }
    }
}

impl PeState {
    /// Root: the recovery's first step ended; the job runs again.
    pub(super) fn recovered(
        &mut self,
        r: Recovery,
        chares: u64,
        placed_ms: f64,
        total_ms: f64,
        migrations: u64,
    ) {
        let seconds = r.noticed.elapsed().as_secs_f64();
        // A warning, seen under the default filter: the job went on, but a
        // node was lost and work since the checkpoint was done twice.
        warn!(
            node = r.node,
            uid = r.uid,
            checkpoint = r.ckpt,
            interrupted_checkpoint = ?r.interrupted,
            chares,
            placed_ms,
            total_ms,
            migrations,
            admitted = r.admitted,
            "recovered from the loss of node {} (uid {}) in {:.1} ms: rolled back to buddy checkpoint {} (the sync point of LB step {}{}), {} PEs{}",
            r.node,
            r.uid,
            seconds * 1e3,
            r.ckpt,
            r.step + 1,
            match r.carried_from {
                Some(epoch) => format!(", taken in epoch {epoch}, before the view changed"),
                None => String::new(),
            },
            self.num_pes(),
            match r.admitted {
                0 => String::new(),
                1 => ", with 1 waiting newcomer admitted".to_owned(),
                n => format!(", with {n} waiting newcomers admitted"),
            }
        );
        crate::activity::recovered(seconds);
    }
}
