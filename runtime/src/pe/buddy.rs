//! Buddy checkpoints in memory and the PE side of a recovery (`+ft-every
//! K`; docs/elasticity.md, "Node loss without notice").
//!
//! Checkpoint, driven by PE 0: at every K-th sync point (every `at_sync`
//! of every element of an array; the first one after a start, a rescale
//! or a recovery whatever K) PE 0 waits for quiescence, as the restart
//! checkpoint does, then tells every PE to take checkpoint `ckpt`
//! ([`SysMsg::BuddySnapshot`]). Each PE keeps a copy of its chares and
//! sends another to its buddy: the PE of the same rank on the next node of
//! the view ([`buddy_of`]), so no chare's two copies share a node. The
//! buddy keeps it in the frame it came in (decoded only if a recovery
//! restores it) and tells PE 0, which also keeps the job's own state
//! (main, readonly values, collections, populations, counters; node 0 is
//! never lost, so that copy stays on it). Once every PE has taken its
//! copies ([`SysMsg::BuddyTaken`]) the step the sync point was for runs
//! while the buddies store the copies (a PE has taken its copies once it
//! handed its buddy's to the transport: over TCP, once the kernel took
//! the whole frame). Once every PE's copy is stored, `ckpt` is complete: PE 0 says so to every PE,
//! which drops older checkpoints. Until then the previous complete
//! checkpoint is kept everywhere (double checkpointing): a loss during a
//! checkpoint, or after its step resumed but before its copies arrived,
//! still finds a consistent one. A sync point reached meanwhile, and a
//! rescale, wait for the checkpoint to be complete.
//!
//! Recovery: the node drivers stop every survivor, drain, drop the failed
//! epoch's messages, commit the view without the lost node and resume with
//! a rollback ([`Scheduler::roll_back`]): every PE forgets its runtime
//! state and its chares; PE 0 restores main and the job's state from its
//! copy, has every PE adopt the collections as a newcomer would, and tells
//! every surviving PE to restore its own chares and the copies it holds of
//! the lost PEs ([`SysMsg::BuddyRestore`]). Newcomers the recovery's commit
//! admitted (replacements that were waiting) adopt the collections too and
//! restore nothing: the step that follows gives them elements. Then the
//! step the checkpoint's sync point was for runs (`pe/checkpoint.rs`'s
//! restore path: it balances with `+lb-rescale`'s strategy and resumes the
//! elements), and the job goes on from the checkpointed iteration in the
//! same processes.
//!
//! A rescale's re-entry keeps every copy (numbered in the view they were
//! taken in; the departed nodes took theirs along) and PE 0 renumbers the
//! last complete checkpoint ([`Complete::carry`]): a loss before the next
//! sync point rolls back to it when every chare still has a copy
//! ([`Complete::cover`]), and ends the job saying which is missing when
//! not. A recovery keeps the checkpoint it rolled back to the same way,
//! until the next is complete.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use ductile_coordinator::proto::NodeId;
use tracing::{debug, info, warn};

use super::checkpoint::{Recovery, RestoreSource, RootRestore};
use super::reduction::Population;
use super::{PeState, Scheduler, misrouted};
use crate::checkpoint::{JobFile, SavedChare};
use crate::msg::{CallbackSpec, CollId, MAIN_COLL, Target};
use crate::rescale::RescaleFailed;
use crate::rescale::plan::Renumbering;
use crate::system::{AdoptedColl, Adoption, BuddyChares, Shape, SysMsg};
use crate::topo::{Pe as PeId, Topology};

use super::Reentry;

/// A PE's buddy checkpoints; PE 0 also drives them.
#[derive(Default)]
pub(super) struct Buddy {
    /// This PE's chares, by checkpoint (shared with the copy sent).
    own: BTreeMap<u64, Arc<Vec<SavedChare>>>,
    /// The copies kept here for other PEs: `(checkpoint, owner)`.
    held: BTreeMap<(u64, PeId), BuddyChares>,
    /// The state buffers of copies no longer kept, at most one per chare
    /// of this PE's last copy: the next checkpoint packs into them, where
    /// fresh memory would cost a page fault per 4 KiB.
    spare: Vec<Vec<u8>>,
    /// Root: sync points since the last checkpoint.
    syncs: u32,
    /// Root: the number of the next checkpoint.
    next_ckpt: u64,
    /// Root: the checkpoint being taken.
    taking: Option<Taking>,
    /// Root: the last complete checkpoint.
    complete: Option<Complete>,
}

/// Root: a checkpoint being taken.
struct Taking {
    ckpt: u64,
    /// The array whose sync point it was taken at.
    coll: CollId,
    started: Instant,
    /// Sync points that came meanwhile: their steps wait for completion.
    deferred: Vec<CollId>,
    job: Option<JobFile>,
    /// PEs whose copies are taken.
    taken: u32,
    /// Once every PE's are: the program's pause, and `coll`'s step runs.
    resumed: Option<f64>,
    stored: u32,
    chares: u64,
    bytes: u64,
    /// The largest copy of one PE.
    max_pe_bytes: u64,
    members: BTreeMap<PeId, Vec<(CollId, u32)>>,
    failures: Vec<String>,
}

/// Root: a checkpoint whose copies are all stored.
struct Complete {
    ckpt: u64,
    /// The view it was taken in: PE numbers in it are that view's.
    epoch: u64,
    /// The current view: rescales since the checkpoint renumbered its PEs
    /// and took the departed nodes' copies along, and left the rest where
    /// they were ([`Complete::carry`]).
    now_epoch: u64,
    /// For each PE of `epoch`, its number now (None: its node left).
    now: Vec<Option<PeId>>,
    /// For each PE of `epoch`, the PE of `epoch` that holds its copy.
    holder: Vec<PeId>,
    job: JobFile,
    chares: u64,
    /// Every PE's group and nodegroup members: `(collection, next reduction)`.
    members: BTreeMap<PeId, Vec<(CollId, u32)>>,
}

/// What rolling back to a complete checkpoint restores in the view a loss
/// leaves ([`Complete::cover`]). PE numbers are the checkpoint's.
#[derive(Debug, PartialEq, Eq)]
struct Cover {
    /// The checkpoint's PEs no longer there: their chares come back from
    /// the copies their buddies hold.
    lost: Vec<PeId>,
    /// Every PE of the view entered that was in the checkpoint's, by its
    /// new number: its old one (it restores its own copy).
    old_of: BTreeMap<PeId, PeId>,
}

impl Complete {
    /// A checkpoint of the current view `topo`, every PE's copy held by
    /// its buddy.
    fn new(
        ckpt: u64,
        topo: &Topology,
        job: JobFile,
        chares: u64,
        members: BTreeMap<PeId, Vec<(CollId, u32)>>,
    ) -> Complete {
        let pes = topo.num_pes();
        Complete {
            ckpt,
            epoch: topo.epoch(),
            now_epoch: topo.epoch(),
            now: (0..pes).map(Some).collect(),
            holder: (0..pes).map(|pe| buddy_of(topo, pe)).collect(),
            job,
            chares,
            members,
        }
    }

    /// Whether a rescale changed the view since it was taken.
    fn carried(&self) -> bool {
        self.now_epoch != self.epoch
    }

    /// A rescale committed view `epoch` with `plan`: the checkpoint stays
    /// consistent (taken at a sync point, it does not depend on where the
    /// elements are now), only its PEs are renumbered.
    fn carry(&mut self, plan: &Renumbering, epoch: u64) {
        self.now = self.after(plan);
        self.now_epoch = epoch;
    }

    /// For each PE of the checkpoint, its number once `plan` is committed.
    fn after(&self, plan: &Renumbering) -> Vec<Option<PeId>> {
        let map = |p: PeId| plan.pe_map.get(p as usize).copied().flatten();
        self.now.iter().map(|pe| pe.and_then(map)).collect()
    }

    /// Whether every chare of the checkpoint still has a copy once `plan`
    /// (a recovery's, from the current view) is committed: each of its PEs
    /// is either still there, with its own copy, or its buddy is.
    fn cover(&self, plan: &Renumbering) -> Result<Cover, String> {
        let after = self.after(plan);
        let mut lost = Vec::new();
        for (pe, holder) in (0..).zip(&self.holder) {
            if after[pe as usize].is_some() {
                continue;
            }
            if after[*holder as usize].is_none() {
                return Err(format!(
                    "checkpoint {} (taken in epoch {}) has no copy left of PE {pe}'s chares: \
                     its node and the node of PE {holder}, which held the copy, are both gone",
                    self.ckpt, self.epoch
                ));
            }
            lost.push(pe);
        }
        let old_of = (0..)
            .zip(&after)
            .filter_map(|(old, new)| new.map(|new| (new, old)))
            .collect();
        Ok(Cover { lost, old_of })
    }
}

/// The buddy of PE `pe`: the PE of the same rank on the next node of
/// `topo` (rank modulo that node's PEs, when nodes differ in size).
pub(crate) fn buddy_of(topo: &Topology, pe: PeId) -> PeId {
    let node = topo.node_of(pe);
    let rank = pe - topo.first_pe(node);
    let next = (node + 1) % topo.num_nodes();
    topo.first_pe(next) + rank % topo.pes_on(next)
}

impl Buddy {
    /// Checkpoint `ckpt` is complete: older copies go, their buffers kept
    /// for the next checkpoint (up to one per chare of this PE's copy).
    fn complete(&mut self, ckpt: u64) {
        let want = self.own.get(&ckpt).map_or(0, |c| c.len());
        let own = self.own.split_off(&ckpt);
        let held = self.held.split_off(&(ckpt, 0));
        let old_own = std::mem::replace(&mut self.own, own);
        let old_held = std::mem::replace(&mut self.held, held);
        let old_held = old_held.into_values().filter_map(|c| match c {
            BuddyChares::Shared(c) => Some(c),
            // The frame it came in: no buffer per chare to keep.
            BuddyChares::Received(_) => None,
        });
        for copy in old_own.into_values().chain(old_held) {
            // Still shared (a send holding it): dropped as it is.
            let Ok(chares) = Arc::try_unwrap(copy) else {
                continue;
            };
            let room = want.saturating_sub(self.spare.len());
            self.spare
                .extend(chares.into_iter().take(room).map(|c| c.state.0));
        }
    }
}

impl PeState {
    /// Root: every element of `coll` is at sync. Returns whether a buddy
    /// checkpoint takes the sync point (its step runs once it is complete).
    pub(super) fn buddy_at_sync(&mut self, coll: CollId) -> bool {
        let every = self.node.options.ft_every;
        if every == 0 || self.topo.num_nodes() < 2 {
            return false;
        }
        if let Some(t) = &mut self.ft.taking {
            // Elements wait at sync while a checkpoint is under way: no
            // step moves any of them before it is complete.
            t.deferred.push(coll);
            return true;
        }
        self.ft.syncs += 1;
        // The first sync point after a start, a recovery or a rescale
        // checkpoints whatever K: until then a loss rolls back further, or
        // finds no copy of some chares (a departed node took them along).
        if self.ft.complete.as_ref().is_some_and(|c| !c.carried()) && self.ft.syncs < every {
            return false;
        }
        self.ft.syncs = 0;
        let ckpt = self.ft.next_ckpt;
        self.ft.next_ckpt += 1;
        self.ft.taking = Some(Taking {
            ckpt,
            coll,
            started: Instant::now(),
            deferred: Vec::new(),
            job: None,
            taken: 0,
            resumed: None,
            stored: 0,
            chares: 0,
            bytes: 0,
            max_pe_bytes: 0,
            members: BTreeMap::new(),
            failures: Vec::new(),
        });
        // Quiescence: nothing of the application queued or in flight.
        self.send_sys(
            0,
            SysMsg::QdStart {
                callback: CallbackSpec {
                    target: Target::BuddyCheckpoint { coll },
                    prefix: Vec::new(),
                },
            },
        );
        true
    }

    /// Root: quiescent at the sync point; every PE takes the checkpoint.
    pub(super) fn buddy_quiescent(&mut self) {
        let Some(ckpt) = self.ft.taking.as_ref().map(|t| t.ckpt) else {
            return;
        };
        for pe in 0..self.num_pes() {
            self.send_sys(pe, SysMsg::BuddySnapshot { ckpt });
        }
    }

    /// Whether a buddy checkpoint is being taken (a rescale waits for it).
    pub(super) fn buddy_busy(&self) -> bool {
        self.ft.taking.is_some()
    }

    /// A rescale re-entered with `plan` into view `epoch`. Every PE keeps
    /// its copies (of the view left, numbered in it), PE 0 renumbers the
    /// last complete checkpoint: a loss before the next one rolls back to
    /// it if every chare still has a copy.
    pub(super) fn buddy_carry(&mut self, plan: &Renumbering, epoch: u64) {
        if let Some(c) = &mut self.ft.complete {
            c.carry(plan, epoch);
        }
    }
}

impl Scheduler {
    /// The buddy service's runtime messages.
    pub(super) fn on_buddy(&mut self, msg: SysMsg) {
        match msg {
            SysMsg::BuddySnapshot { ckpt } => self.buddy_snapshot(ckpt),
            SysMsg::BuddyTaken { ckpt } => self.buddy_taken(ckpt),
            SysMsg::BuddyCopy {
                ckpt,
                pe,
                members,
                chares,
            } => {
                let result = Ok((chares.count(), chares.state_bytes()));
                self.ctx.ft.held.insert((ckpt, pe), chares);
                self.ctx.send_sys(
                    0,
                    SysMsg::BuddyStored {
                        ckpt,
                        pe,
                        members,
                        result,
                    },
                );
            }
            SysMsg::BuddyStored {
                ckpt,
                pe,
                members,
                result,
            } => self.buddy_stored(ckpt, pe, members, result),
            SysMsg::BuddyComplete { ckpt } => self.ctx.ft.complete(ckpt),
            SysMsg::BuddyRestore { ckpt, lost } => self.buddy_restore(ckpt, &lost),
            other => misrouted(self.ctx.pe, "buddy", &other),
        }
    }

    /// Every PE: keeps a copy of its chares and sends one to its buddy.
    fn buddy_snapshot(&mut self, ckpt: u64) {
        let me = self.ctx.pe;
        if me == 0 {
            let job = self
                .ctx
                .ft
                .taking
                .as_ref()
                .map(|t| t.coll)
                .map(|coll| self.job_snapshot(coll));
            if let (Some(t), Some(job)) = (self.ctx.ft.taking.as_mut(), job) {
                match job {
                    Ok(job) => t.job = Some(job),
                    Err(e) => t.failures.push(format!("the job's state: {e}")),
                }
            }
        }
        if let Some(why) = self.ctx.unsettled() {
            let result = Err(why);
            let members = Vec::new();
            let stored = SysMsg::BuddyStored {
                ckpt,
                pe: me,
                members,
                result,
            };
            self.ctx.send_sys(0, stored);
        } else {
            let began = Instant::now();
            let mut spare = std::mem::take(&mut self.ctx.ft.spare);
            let chares = Arc::new(self.snapshot_chares(&mut spare));
            self.ctx.ft.spare = spare;
            let packed = began.elapsed();
            let members = chares
                .iter()
                .filter(|c| !self.ctx.is_migratable(c.coll))
                .map(|c| (c.coll, c.meta.next_red))
                .collect();
            self.ctx.ft.own.insert(ckpt, chares.clone());
            let buddy = buddy_of(&self.ctx.topo, me);
            self.ctx.send_sys(
                buddy,
                SysMsg::BuddyCopy {
                    ckpt,
                    pe: me,
                    members,
                    chares: BuddyChares::Shared(chares),
                },
            );
            debug!(
                pe = me,
                ckpt,
                packed_ms = packed.as_secs_f64() * 1e3,
                sent_ms = (began.elapsed() - packed).as_secs_f64() * 1e3,
                "buddy copies taken"
            );
        }
        self.ctx.send_sys(0, SysMsg::BuddyTaken { ckpt });
    }

    /// Root: one PE's copies are taken; once every PE's are, the program goes
    /// on while they travel (the checkpoint is complete once stored).
    fn buddy_taken(&mut self, ckpt: u64) {
        let npes = self.ctx.num_pes();
        let Some(t) = self.ctx.ft.taking.as_mut().filter(|t| t.ckpt == ckpt) else {
            // Stored everywhere before the last of these came: complete.
            return;
        };
        t.taken += 1;
        if t.taken < npes {
            return;
        }
        t.resumed = Some(t.started.elapsed().as_secs_f64());
        let colls: Vec<CollId> = std::iter::once(t.coll)
            .chain(t.deferred.drain(..))
            .collect();
        for coll in colls {
            self.ctx.lb_after_checkpoint(coll);
        }
    }

    /// Root: PE `pe`'s copy is stored at its buddy (or could not be taken).
    fn buddy_stored(
        &mut self,
        ckpt: u64,
        pe: PeId,
        members: Vec<(CollId, u32)>,
        result: Result<(u64, u64), String>,
    ) {
        let npes = self.ctx.num_pes();
        let Some(t) = self.ctx.ft.taking.as_mut().filter(|t| t.ckpt == ckpt) else {
            debug!(ckpt, pe, "a buddy copy of a checkpoint no longer taken");
            return;
        };
        t.stored += 1;
        match result {
            Ok((chares, bytes)) => {
                t.chares += chares;
                t.bytes += bytes;
                t.max_pe_bytes = t.max_pe_bytes.max(bytes);
                t.members.insert(pe, members);
            }
            Err(e) => t.failures.push(e),
        }
        if t.stored < npes {
            return;
        }
        let t = self.ctx.ft.taking.take().expect("checked");
        let seconds = t.started.elapsed().as_secs_f64();
        let pause = t.resumed.unwrap_or(seconds);
        match t.job {
            Some(job) if t.failures.is_empty() => {
                for pe in 0..npes {
                    self.ctx.send_sys(pe, SysMsg::BuddyComplete { ckpt });
                }
                // Each PE holds its own copy, its buddy's and the buffers
                // to pack the next into: about three times `max_pe_bytes`,
                // four while the next is taken.
                let line = format!(
                    "ft checkpoint={ckpt} chares={} bytes={} max_pe_bytes={} pause_ms={:.3} total_ms={:.3}",
                    t.chares,
                    t.bytes,
                    t.max_pe_bytes,
                    pause * 1e3,
                    seconds * 1e3
                );
                info!("{line}");
                if self.ctx.node.options.lb_report {
                    println!("{line}");
                }
                crate::activity::buddy_checkpoint(pause, seconds, t.bytes);
                let topo = &self.ctx.topo;
                let c = Complete::new(ckpt, topo, job, t.chares, t.members);
                self.ctx.ft.complete = Some(c);
            }
            _ => {
                let kept = self.ctx.ft.complete.as_ref().map(|c| c.ckpt);
                warn!(
                    ckpt,
                    "buddy checkpoint failed ({}); the last complete one ({kept:?}) stays",
                    t.failures.join("; ")
                );
            }
        }
        // The steps whose sync points the checkpoint held run now: its
        // own if the copies were stored before every PE said it took them.
        let own = t.resumed.is_none().then_some(t.coll);
        for coll in own.into_iter().chain(t.deferred) {
            self.ctx.lb_after_checkpoint(coll);
        }
        if self.ctx.rescaling.root.is_some() {
            self.rescale_advance();
        }
    }

    /// Every survivor of a lost node, in the new view: forgets the failed
    /// epoch (runtime state, queued messages, chares) and waits for PE 0's
    /// restore; PE 0 starts it.
    pub(super) fn roll_back(&mut self, r: &Reentry) {
        let map = |pe: PeId| r.plan.pe_map.get(pe as usize).copied().flatten();
        let old_me = self.ctx.pe;
        let new_me = map(old_me).expect("only survivors roll back");
        let _span =
            tracing::debug_span!(parent: &r.span, "rollback", epoch = r.old.epoch(), pe = old_me)
                .entered();
        let node = self.ctx.node.clone();
        if let Some(rescale) = self.ctx.rescaling.root.take() {
            let why =
                "a node was lost without notice and the job rolled back to its last checkpoint"
                    .to_owned();
            // The view rolled back in is the one the rescale committed:
            // the loss came after its commit.
            let failed = if r.old.epoch() > rescale.epoch() {
                RescaleFailed::RolledBack { why }
            } else {
                RescaleFailed::Abandoned {
                    when: "before its commit",
                    why,
                }
            };
            node.finish_rescale(Err(failed));
        }
        if self.ctx.ckpt.taking.take().is_some() {
            self.ctx
                .checkpoint_answer(Err(crate::checkpoint::CheckpointError::Unsettled(
                    "a node was lost without notice and the job rolled back".into(),
                )));
        }
        self.ctx.pe = new_me;
        self.ctx.topo = r.new.clone();
        self.ctx.reset_runtime_state();
        self.stores.clear();
        debug!(
            old = old_me,
            new = new_me,
            "PE rolled back; waiting for the restore"
        );
        if new_me == 0 {
            self.buddy_recover(r);
        }
    }

    /// PE 0 of a recovery: restores main and the job's state from the last
    /// complete checkpoint and has every PE restore its chares.
    fn buddy_recover(&mut self, r: &Reentry) {
        let node = self.ctx.node.clone();
        let (lost_node, uid, noticed) =
            node.take_loss().unwrap_or((NodeId::MAX, 0, Instant::now()));
        let interrupted = self.ctx.ft.taking.take().map(|t| t.ckpt);
        let covered = match self.ctx.ft.complete.take() {
            Some(c) if c.now_epoch == r.old.epoch() => c.cover(&r.plan).map(|cover| (c, cover)),
            Some(c) => Err(format!(
                "the last one was carried to epoch {}, not {}",
                c.now_epoch,
                r.old.epoch()
            )),
            None => Err("none was complete (the job had not reached a checkpoint since its start or its last recovery)".into()),
        };
        let (c, cover) = match covered {
            Ok(covered) => covered,
            Err(why) => {
                node.abort(format!(
                    "lost node {lost_node} (uid {uid}) without notice and no buddy checkpoint of epoch {} covers it: {why}; ending the job",
                    r.old.epoch()
                ));
                return;
            }
        };
        match self.restore_from_buddies(&c, r, &cover) {
            Ok(()) => {
                self.ctx.ckpt.restoring = Some(RootRestore {
                    source: RestoreSource::Recovery(Recovery {
                        node: lost_node,
                        uid,
                        ckpt: c.ckpt,
                        noticed,
                        step: c.job.lb_steps.iter().find(|(coll, _)| *coll == c.job.synced).map_or(0, |(_, s)| *s),
                        interrupted,
                        carried_from: c.carried().then_some(c.epoch),
                        admitted: r.new.num_nodes() - survivors(r),
                    }),
                    synced: c.job.synced,
                    acks: 0,
                    chares: c.chares + 1,
                    started: Instant::now(),
                    placed_ms: 0.0,
                });
                // Rolled back to, it stays the checkpoint until the next
                // one: a loss before then rolls back to it again.
                let mut c = c;
                c.carry(&r.plan, r.new.epoch());
                self.ctx.ft.complete = Some(c);
            }
            Err(e) => node.abort(format!(
                "lost node {lost_node} (uid {uid}) without notice; restoring checkpoint {} failed: {e}; ending the job",
                c.ckpt
            )),
        }
    }

    fn restore_from_buddies(
        &mut self,
        c: &Complete,
        r: &Reentry,
        cover: &Cover,
    ) -> Result<(), String> {
        let Cover { lost, old_of } = cover;
        let job = &c.job;
        let reg = self.ctx.node.registry.clone();
        let main_type = reg.main_type.ok_or("no main chare registered")?;
        let entry = reg.chares.get(&main_type).expect("main type is registered");
        let mut main = (entry.make)(MAIN_COLL);
        main.unpack(0, &job.main.state, job.main.meta.clone(), &mut self.ctx)
            .map_err(|e| format!("the main chare: {e}"))?;
        self.stores.insert(MAIN_COLL, main);
        self.ctx.loc.specs = job.specs.clone();
        self.ctx.rescaling.callbacks = job.rescale_callbacks.clone();
        self.ctx.loc.next_bcast = job.broadcasts.iter().copied().collect();
        self.ctx.lb.steps = job.lb_steps.iter().copied().collect();
        let mut populations: BTreeMap<CollId, Population> = job
            .populations
            .iter()
            .map(|(coll, p)| {
                let pop = Population {
                    base: p.base,
                    births: p.births.clone(),
                    next_open: p.next_open,
                    done: BTreeMap::new(),
                };
                (*coll, pop)
            })
            .collect();
        // The lost PEs' group and nodegroup members end with them.
        for pe in lost {
            for &(coll, next_red) in c.members.get(pe).into_iter().flatten() {
                if let Some(p) = populations.get_mut(&coll) {
                    *p.births.entry(next_red).or_insert(0) -= 1;
                }
            }
        }
        let red_start: BTreeMap<CollId, u32> = job
            .specs
            .iter()
            .filter_map(|spec| {
                let p = populations.get(&spec.coll)?;
                let pe0 = c.members.get(&0).into_iter().flatten();
                let start = pe0
                    .filter(|(coll, _)| *coll == spec.coll)
                    .map(|(_, n)| *n)
                    .next()
                    .unwrap_or(p.next_open)
                    .max(p.next_open);
                Some((spec.coll, start))
            })
            .collect();
        let pes = self.ctx.num_pes();
        // Newcomers since the checkpoint (admitted by the recovery's commit
        // or by rescales it was carried across): their group and nodegroup
        // members join the reductions PE 0's member is at, as after a
        // rescale (`Scheduler::adoption`). Nodes come and go whole.
        let new_pes = pes - old_of.len() as u32;
        let new_nodes = (0..r.new.num_nodes())
            .filter(|&n| !old_of.contains_key(&r.new.first_pe(n)))
            .count() as u32;
        for spec in &job.specs {
            let joining = match spec.shape {
                Shape::Group => new_pes,
                Shape::NodeGroup => new_nodes,
                Shape::Array { .. } => 0,
            };
            if let (Some(p), Some(&start), true) = (
                populations.get_mut(&spec.coll),
                red_start.get(&spec.coll),
                joining > 0,
            ) {
                *p.births.entry(start).or_insert(0) += i64::from(joining);
            }
        }
        self.ctx.red.populations = populations.into_iter().collect();

        let broadcasts: BTreeMap<CollId, u64> = job.broadcasts.iter().copied().collect();
        for pe in 0..pes {
            let own = old_of.get(&pe).and_then(|old| c.members.get(old));
            let colls = job
                .specs
                .iter()
                .map(|spec| AdoptedColl {
                    spec: spec.clone(),
                    last_bcast: broadcasts.get(&spec.coll).copied().unwrap_or(0),
                    red_start: red_start.get(&spec.coll).copied().unwrap_or(0),
                    skip_members: own.is_some_and(|m| m.iter().any(|(coll, _)| *coll == spec.coll)),
                })
                .collect();
            let adoption = Adoption {
                readonly: job.readonly.clone(),
                colls,
            };
            self.ctx.send_sys(pe, SysMsg::Adopt(adoption));
            if old_of.contains_key(&pe) {
                let restore = SysMsg::BuddyRestore {
                    ckpt: c.ckpt,
                    lost: lost.to_vec(),
                };
                self.ctx.send_sys(pe, restore);
            }
            self.ctx.send_sys(pe, SysMsg::RestoreSent);
        }
        info!(
            ckpt = c.ckpt,
            lost = ?lost,
            pes,
            new_pes,
            chares = c.chares,
            "rolling back to the last buddy checkpoint"
        );
        Ok(())
    }

    /// Every PE of a recovery: its own chares of checkpoint `ckpt`, and the
    /// array elements of the lost PEs whose copies it holds, come back here.
    /// The copies stay: the checkpoint is the one to roll back to until
    /// the next is complete.
    fn buddy_restore(&mut self, ckpt: u64, lost: &[PeId]) {
        let me = self.ctx.pe;
        let Some(own) = self.ctx.ft.own.get(&ckpt).cloned() else {
            self.ctx.node.abort(format!(
                "PE {me} holds no copy of buddy checkpoint {ckpt} to roll back to; ending the job"
            ));
            return;
        };
        let copies: Vec<_> = lost
            .iter()
            .filter_map(|&pe| self.ctx.ft.held.remove_entry(&(ckpt, pe)))
            .collect();
        let mut adopted = Vec::new();
        for (_, copy) in &copies {
            match copy.chares() {
                Ok(chares) => adopted.extend(chares),
                Err(e) => {
                    // Checked when it arrived: only a bug gets here.
                    self.ctx.node.abort(format!(
                        "PE {me}: a buddy copy of checkpoint {ckpt} no longer decodes ({e}); ending the job"
                    ));
                    return;
                }
            }
        }
        adopted.retain(|c| self.ctx.is_migratable(c.coll));
        let (mine, theirs) = (own.len(), adopted.len());
        for c in own.iter() {
            self.restore_chare(c.coll, c.key, &c.state, c.meta.clone());
        }
        for c in adopted {
            self.restore_chare(c.coll, c.key, c.state, c.meta);
        }
        self.ctx.ft.held.extend(copies);
        debug!(
            pe = me,
            ckpt, mine, theirs, "chares restored from the buddy checkpoint"
        );
    }
}

/// How many nodes of the view `r` leaves are in the view it enters.
fn survivors(r: &Reentry) -> u32 {
    r.plan.node_map.iter().flatten().count() as u32
}

#[cfg(test)]
mod tests {
    use ductile_coordinator::proto::{Member, View};

    use super::*;

    fn view(pes: &[u32]) -> View {
        View {
            epoch: 1,
            members: pes
                .iter()
                .enumerate()
                .map(|(i, &pes)| Member {
                    node: i as u32,
                    uid: 10 + i as u64,
                    address: vec![],
                    pes,
                    host: "t".into(),
                    pid: i as u32,
                })
                .collect(),
        }
    }

    fn copy(sizes: &[usize]) -> Arc<Vec<SavedChare>> {
        Arc::new(
            sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| SavedChare {
                    coll: 1,
                    key: k as crate::msg::IndexKey,
                    state: crate::Bulk(vec![7u8; n]),
                    meta: Default::default(),
                })
                .collect(),
        )
    }

    /// A complete checkpoint drops the older copies, own and held, and
    /// keeps their state buffers (memory already touched) for the next,
    /// never more than one per chare of this PE's copy; a copy still shared
    /// is dropped as it is.
    #[test]
    fn a_complete_checkpoint_keeps_the_old_copies_buffers_for_the_next() {
        let mut b = Buddy::default();
        b.own.insert(3, copy(&[100, 200]));
        b.own.insert(4, copy(&[100, 200]));
        b.held
            .insert((3, 9), BuddyChares::Shared(copy(&[300, 400, 500])));
        b.held.insert((4, 9), BuddyChares::Shared(copy(&[300])));
        let shared = copy(&[50]);
        b.held.insert((3, 8), BuddyChares::Shared(shared.clone()));
        b.complete(4);
        assert_eq!(b.own.keys().copied().collect::<Vec<_>>(), vec![4]);
        assert_eq!(b.held.keys().copied().collect::<Vec<_>>(), vec![(4, 9)]);
        assert_eq!(b.spare.len(), 2, "one per chare of the own copy");
        assert!(b.spare.iter().all(|s| s.capacity() >= 100));
        assert_eq!(Arc::strong_count(&shared), 1, "a shared copy is let go");
    }

    /// A renumbering by PE (one PE per node in these tests).
    fn renumber(pe_map: &[Option<PeId>]) -> Renumbering {
        Renumbering {
            node_map: pe_map.to_vec(),
            pe_map: pe_map.to_vec(),
            leaving_pes: (0..)
                .zip(pe_map)
                .filter(|(_, new)| new.is_none())
                .map(|(pe, _)| pe)
                .collect(),
            surviving_pes: pe_map.iter().flatten().count() as u32,
        }
    }

    fn checkpoint_of(nodes: usize) -> Complete {
        let topo = Topology::new(&view(&vec![1; nodes]), 0);
        let job = JobFile {
            pes: nodes as u32,
            nodes: nodes as u32,
            readonly: Vec::new(),
            specs: Vec::new(),
            populations: Vec::new(),
            broadcasts: Vec::new(),
            lb_steps: Vec::new(),
            synced: 1,
            main: SavedChare {
                coll: MAIN_COLL,
                key: 0,
                state: crate::Bulk(Vec::new()),
                meta: Default::default(),
            },
            rescale_callbacks: Vec::new(),
        };
        Complete::new(5, &topo, job, 10, BTreeMap::new())
    }

    /// A loss in the view the checkpoint was taken in: the lost PE's
    /// chares come from its buddy, every other PE restores its own; a node
    /// lost with its buddy leaves no copy.
    #[test]
    fn a_loss_is_covered_unless_a_pe_and_its_buddy_are_both_gone() {
        let c = checkpoint_of(3);
        assert!(!c.carried());
        let cover = c.cover(&renumber(&[Some(0), Some(1), None])).unwrap();
        assert_eq!(cover.lost, vec![2]);
        assert_eq!(cover.old_of, BTreeMap::from([(0, 0), (1, 1)]));
        let c = checkpoint_of(4);
        let both = c.cover(&renumber(&[Some(0), Some(1), None, None]));
        let why = both.unwrap_err();
        assert!(
            why.contains("PE 2's chares") && why.contains("PE 3"),
            "{why}"
        );
    }

    /// Carried across a shrink, the checkpoint still covers a loss when
    /// every gone PE (departed or lost) has its buddy left; when the
    /// rescale took a lost PE's buddy away, the loss is not covered.
    #[test]
    fn a_checkpoint_carried_across_a_shrink_covers_losses_whose_copies_stayed() {
        // Node 1 leaves (its copy is on node 2), then node 3 (now PE 2) is
        // lost (its copy is on node 0).
        let mut c = checkpoint_of(4);
        c.carry(&renumber(&[Some(0), None, Some(1), Some(2)]), 2);
        assert!(c.carried());
        assert_eq!(c.now, vec![Some(0), None, Some(1), Some(2)]);
        let cover = c.cover(&renumber(&[Some(0), Some(1), None])).unwrap();
        assert_eq!(cover.lost, vec![1, 3]);
        assert_eq!(cover.old_of, BTreeMap::from([(0, 0), (1, 2)]));
        // Node 3 leaves, then node 2 is lost: its copy left with node 3.
        let mut c = checkpoint_of(4);
        c.carry(&renumber(&[Some(0), Some(1), Some(2), None]), 2);
        let why = c.cover(&renumber(&[Some(0), Some(1), None])).unwrap_err();
        assert!(
            why.contains("PE 2's chares") && why.contains("epoch 1"),
            "{why}"
        );
    }

    /// After a recovery the checkpoint rolled back to stays: a second
    /// loss is covered unless it takes the last copy of some PE's chares
    /// (the first lost node's, now only on its buddy; or a node whose
    /// buddy was the first one lost).
    #[test]
    fn a_checkpoint_rolled_back_to_covers_a_second_loss_whose_copies_are_left() {
        let mut c = checkpoint_of(5);
        c.carry(&renumber(&[Some(0), Some(1), None, Some(2), Some(3)]), 2);
        let cover = c
            .cover(&renumber(&[Some(0), Some(1), Some(2), None]))
            .unwrap();
        assert_eq!(cover.lost, vec![2, 4]);
        assert_eq!(cover.old_of, BTreeMap::from([(0, 0), (1, 1), (2, 3)]));
        // Node 1 (its copy was on node 2), node 3 (the only copy of node 2's).
        for plan in [
            [Some(0), None, Some(1), Some(2)],
            [Some(0), Some(1), None, Some(2)],
        ] {
            assert!(c.cover(&renumber(&plan)).is_err(), "{plan:?}");
        }
    }

    /// Across an expand nothing of the checkpoint moves: losing a newcomer
    /// loses no copy, and the other newcomers restore nothing.
    #[test]
    fn a_newcomer_lost_after_an_expand_loses_no_copy() {
        let mut c = checkpoint_of(2);
        c.carry(&renumber(&[Some(0), Some(1)]), 2);
        // The view is now 4 PEs (2 and 3 new); PE 2 is lost.
        let cover = c
            .cover(&renumber(&[Some(0), Some(1), None, Some(2)]))
            .unwrap();
        assert!(cover.lost.is_empty());
        assert_eq!(cover.old_of, BTreeMap::from([(0, 0), (1, 1)]));
    }

    #[test]
    fn every_pe_s_buddy_is_on_the_next_node_and_never_its_own() {
        for shape in [
            &[1, 1][..],
            &[2, 2, 2],
            &[1, 3, 2],
            &[4, 1],
            &[2, 2, 2, 2, 2],
        ] {
            let topo = Topology::new(&view(shape), 0);
            for pe in 0..topo.num_pes() {
                let b = buddy_of(&topo, pe);
                assert!(b < topo.num_pes(), "{shape:?}: PE {pe} -> {b}");
                let next = (topo.node_of(pe) + 1) % topo.num_nodes();
                assert_eq!(topo.node_of(b), next, "{shape:?}: PE {pe} -> {b}");
            }
        }
        let topo = Topology::new(&view(&[2, 2]), 0);
        assert_eq!(
            (0..4).map(|p| buddy_of(&topo, p)).collect::<Vec<_>>(),
            vec![2, 3, 0, 1],
            "same rank on the next node"
        );
    }
}
