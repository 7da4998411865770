//! Whole jobs of node drivers in virtual time: a simulated network (one FIFO
//! per link, links served in a seeded random order), a simulated
//! coordinator and simulated PEs; no thread, no socket, no sleeping.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use ductile_coordinator::proto::{Member, View};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::rescale::plan::{plan, RescaleRequest};

const STEP: Duration = Duration::from_secs(2);

fn cfg(pes: usize, drain: DrainMode) -> Config {
    Config {
        local_pes: pes,
        drain,
        step: STEP,
        admission: Duration::from_secs(3600),
        commit_tries: 3,
        recover: false,
    }
}

fn member(node: NodeId, uid: u64, pes: u32) -> Member {
    Member {
        node,
        uid,
        address: vec![],
        pes,
        host: "sim".into(),
        pid: uid as u32,
    }
}

/// How a node's part ended.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Resumed {
        epoch: u64,
        members: Vec<u64>,
    },
    Joined {
        epoch: u64,
        members: Vec<u64>,
    },
    Departed,
    Failed(Failure),
    /// The coordinator reported member `uid` lost while no rescale ran.
    Lost {
        uid: u64,
    },
    /// A recovery ended: rolled back and resumed in `epoch`.
    RolledBack {
        epoch: u64,
        members: Vec<u64>,
    },
}

/// Who a queued item is from: a node (by uid), the coordinator, or the
/// node's own PEs and shell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Src {
    Node(u64),
    Coordinator,
    Local,
}

enum Item {
    Event(Event),
    /// An application envelope frame from `from`, counted when delivered.
    Envelope {
        from: u64,
        epoch: u64,
    },
}

struct SimNode {
    uid: u64,
    pes: u32,
    driver: Driver,
    view: Option<View>,
    alive: bool,
    draining: bool,
    /// Envelope frames by (epoch, peer uid).
    sent: HashMap<(u64, u64), u64>,
    received: HashMap<(u64, u64), u64>,
    outcomes: Vec<Outcome>,
    /// Whether `TakeLate` came with every frame of the epoch in.
    late_complete: Vec<bool>,
    stages: Vec<Stage>,
    /// Its PEs were told to stop (each stops once) and have not resumed.
    stopping: bool,
    /// A recovery's stop waits in its PEs' inboxes: they take it as they
    /// resume.
    stop_queued: Option<StopOrder>,
}

/// Faults a scenario injects.
#[derive(Clone, Default)]
struct Faults {
    /// Frames from this uid are never delivered when `silent_in` says so.
    silent: Option<(u64, fn(&ControlFrame) -> bool)>,
    /// Kill this uid the first time any node's actions match.
    kill: Option<(u64, fn(&Action) -> bool)>,
    /// The coordinator refuses every commit.
    refuse_commit: bool,
    /// Newcomers that vanish right after node 0's first query.
    vanish_after_query: usize,
    /// Node 0's connection ends under this many of its first queries
    /// (before the coordinator answers).
    lose_queries: u32,
    /// Node 0's connection ends under this many of its first commits,
    /// before the coordinator read them (nothing is committed).
    lose_commits: u32,
    /// Node 0's connection ends under its first commit after the
    /// coordinator made it (Die and Integrate sent, the answer lost).
    lose_after_made: bool,
    /// Node 0 cannot learn the coordinator's view.
    view_unreachable: bool,
    /// The coordinator's view comes after the notices the coordinator
    /// sent before it (on its link), not at once.
    view_after_notices: bool,
    /// A control frame to a node whose process ended fails at once (the
    /// transport knows the peer is gone, as UCX does), instead of being
    /// lost on the way.
    sends_to_dead_fail: bool,
}

struct Sim {
    now: Instant,
    rng: StdRng,
    nodes: BTreeMap<u64, SimNode>,
    /// One FIFO per link (from, to uid).
    links: BTreeMap<(Src, u64), VecDeque<Item>>,
    /// The coordinator's view and its pending newcomers (uids).
    view: View,
    pending: Vec<u64>,
    views: HashMap<u64, View>,
    faults: Faults,
    killed: bool,
    queried: bool,
    /// Node 0's queries, commits and asks for the view, as the
    /// coordinator saw them (lost ones included).
    queries: u32,
    commits: u32,
    views_asked: u32,
    /// Members of the coordinator's view announced lost: a commit that
    /// keeps one is refused.
    lost: Vec<u64>,
}

impl Sim {
    /// A job of `pes.len()` members (uids 100, 101, ...) and `newcomers`
    /// registered newcomers (uids 1000, ...), each of 2 PEs.
    fn new(pes: &[u32], newcomers: usize, drain: DrainMode, seed: u64) -> Sim {
        let view = View {
            epoch: 7,
            members: pes
                .iter()
                .enumerate()
                .map(|(i, &p)| member(i as NodeId, 100 + i as u64, p))
                .collect(),
        };
        let now = Instant::now();
        let mut nodes = BTreeMap::new();
        for m in &view.members {
            let topo = Arc::new(Topology::new(&view, m.node));
            nodes.insert(
                m.uid,
                SimNode::new(
                    m.uid,
                    m.pes,
                    Driver::member(cfg(m.pes as usize, drain), topo),
                    Some(view.clone()),
                ),
            );
        }
        let mut pending = Vec::new();
        for i in 0..newcomers {
            let uid = 1000 + i as u64;
            nodes.insert(
                uid,
                SimNode::new(uid, 2, Driver::newcomer(cfg(2, drain), now), None),
            );
            pending.push(uid);
        }
        let mut views = HashMap::new();
        views.insert(view.epoch, view.clone());
        Sim {
            now,
            rng: StdRng::seed_from_u64(seed),
            nodes,
            links: BTreeMap::new(),
            view,
            pending,
            views,
            faults: Faults::default(),
            killed: false,
            queried: false,
            queries: 0,
            commits: 0,
            views_asked: 0,
            lost: Vec::new(),
        }
    }

    fn push(&mut self, from: Src, to: u64, item: Item) {
        self.links.entry((from, to)).or_default().push_back(item);
    }

    /// Application frames in flight when the PEs stop: `n` from every node
    /// to a few others.
    fn traffic(&mut self, n: u64) {
        let uids: Vec<u64> = self.view.members.iter().map(|m| m.uid).collect();
        for &a in &uids {
            for &b in &uids {
                if a != b && self.rng.gen_bool(0.6) {
                    for _ in 0..n {
                        self.send_envelope(a, b);
                    }
                }
            }
        }
    }

    fn send_envelope(&mut self, from: u64, to: u64) {
        let node = self.nodes.get_mut(&from).expect("node");
        let epoch = node.epoch();
        *node.sent.entry((epoch, to)).or_default() += 1;
        self.push(Src::Node(from), to, Item::Envelope { from, epoch });
    }

    /// Starts a rescale: the request's plan, and every PE stops.
    fn rescale(&mut self, remove: Vec<NodeId>, admit: u32) {
        let req = RescaleRequest {
            epoch: self.view.epoch,
            remove,
            admit,
        };
        let plan = plan(&self.view, &req).expect("a valid request");
        let order = StopOrder {
            epoch: req.epoch,
            remove: req.remove,
            admit: req.admit,
            plan,
        };
        for m in self.view.members.clone() {
            self.nodes.get_mut(&m.uid).expect("member").stopping = true;
            for _ in 0..m.pes {
                self.push(
                    Src::Local,
                    m.uid,
                    Item::Event(Event::PeStopped(order.clone())),
                );
            }
        }
    }

    fn counts(&self, uid: u64) -> Counts {
        let n = &self.nodes[&uid];
        let Some(view) = &n.view else {
            return Counts::default();
        };
        let e = view.epoch;
        Counts {
            sent: view
                .members
                .iter()
                .map(|m| n.sent.get(&(e, m.uid)).copied().unwrap_or(0))
                .collect(),
            received: view
                .members
                .iter()
                .map(|m| n.received.get(&(e, m.uid)).copied().unwrap_or(0))
                .collect(),
        }
    }

    /// Feeds `event` to node `uid` and carries out its actions (answers
    /// to actions are fed at once, as the shell does).
    fn feed(&mut self, uid: u64, event: Event) {
        let mut queue = VecDeque::from([event]);
        while let Some(event) = queue.pop_front() {
            if !self.nodes[&uid].alive {
                return;
            }
            let needs_counts = matches!(event, Event::PeStopped(_) | Event::HandedOver);
            if needs_counts {
                let c = self.counts(uid);
                let now = self.now;
                let actions = self
                    .nodes
                    .get_mut(&uid)
                    .expect("node")
                    .driver
                    .on_event(Event::Counts(c), now);
                self.act(uid, actions, &mut queue);
            }
            let now = self.now;
            let actions = self
                .nodes
                .get_mut(&uid)
                .expect("node")
                .driver
                .on_event(event, now);
            self.act(uid, actions, &mut queue);
        }
    }

    fn act(&mut self, uid: u64, actions: Vec<Action>, answers: &mut VecDeque<Event>) {
        for a in actions {
            if !self.nodes[&uid].alive {
                return;
            }
            if let Some((victim, when)) = self.faults.kill {
                if !self.killed && when(&a) {
                    self.killed = true;
                    self.kill(victim);
                    if victim == uid {
                        return;
                    }
                }
            }
            match a {
                Action::Send { to, epoch, frame } => {
                    let view = &self.views[&epoch];
                    let src = view.by_uid(uid).map(|m| m.node);
                    let sender_view = self.nodes[&uid].view.clone().expect("a member sends");
                    let src_now = sender_view.by_uid(uid).expect("in its view").node;
                    assert_eq!(
                        src,
                        Some(src_now),
                        "frames are tagged with the sender's id in the epoch they name"
                    );
                    let to_uid = view.members[to as usize].uid;
                    if self.faults.sends_to_dead_fail && !self.nodes[&to_uid].alive {
                        let error = format!("sending to uid {to_uid}: the peer is gone");
                        answers.push_back(Event::SendFailed { to, error });
                        continue;
                    }
                    if let Some((silent, what)) = self.faults.silent {
                        if silent == uid && what(&frame) {
                            continue;
                        }
                    }
                    let event = Event::Frame {
                        src: src_now,
                        epoch_bits: epoch & 0xffff,
                        frame,
                    };
                    self.push(Src::Node(uid), to_uid, Item::Event(event));
                }
                Action::Draining(on) => {
                    self.nodes.get_mut(&uid).expect("node").draining = on;
                    if on {
                        answers.push_back(Event::Counts(self.counts(uid)));
                    }
                }
                Action::HandOver { leaving } => {
                    let pes = self.nodes[&uid].pes;
                    for _ in 0..pes {
                        if leaving {
                            // A departing PE sends what it holds to PE 0.
                            let zero = self.view.members[0].uid;
                            for _ in 0..3 {
                                self.send_envelope(uid, zero);
                            }
                        }
                        self.push(Src::Local, uid, Item::Event(Event::HandedOver));
                    }
                }
                Action::TakeLate => {
                    let me = &self.nodes[&uid];
                    let e = me.epoch();
                    let complete = self.nodes.values().all(|n| {
                        n.sent.get(&(e, uid)).copied().unwrap_or(0)
                            == me.received.get(&(e, n.uid)).copied().unwrap_or(0)
                    });
                    self.nodes
                        .get_mut(&uid)
                        .expect("node")
                        .late_complete
                        .push(complete);
                }
                Action::StageEnded(s) => self.nodes.get_mut(&uid).expect("node").stages.push(s),
                Action::QueryPending { epoch } => {
                    assert_eq!(epoch, self.view.epoch);
                    self.queries += 1;
                    if self.queries <= self.faults.lose_queries {
                        let lost = Unanswered::Lost("the connection is closed".into());
                        answers.push_back(Event::Pending(Err(lost)));
                        continue;
                    }
                    let n = self.pending.len() as u32;
                    if !self.queried {
                        self.queried = true;
                        for _ in 0..self.faults.vanish_after_query.min(self.pending.len()) {
                            let gone = self.pending.remove(0);
                            self.kill(gone);
                        }
                    }
                    answers.push_back(Event::Pending(Ok(n)));
                }
                Action::Commit {
                    epoch,
                    remove,
                    admit,
                } => {
                    self.commits += 1;
                    let lost = || Err(Unanswered::Lost("the connection is closed".into()));
                    let answer = if self.commits <= self.faults.lose_commits {
                        lost()
                    } else if self.commits == 1 && self.faults.lose_after_made {
                        self.commit(epoch, &remove, admit).and_then(|_| lost())
                    } else {
                        self.commit(epoch, &remove, admit)
                    };
                    answers.push_back(Event::Committed(answer));
                }
                Action::AskView { epoch } => {
                    assert_eq!(uid, 100, "node 0 asks");
                    assert!(epoch == self.view.epoch || epoch + 1 == self.view.epoch);
                    self.views_asked += 1;
                    let answer = if self.faults.view_unreachable {
                        Err(ViewUnanswered {
                            addr: "127.0.0.1:1".into(),
                            bound: Duration::from_secs(2),
                            last: "the connection was reset".into(),
                        })
                    } else {
                        Ok(self.view.clone())
                    };
                    if self.faults.view_after_notices {
                        let e = Item::Event(Event::ViewNow(answer));
                        self.push(Src::Coordinator, uid, e);
                    } else {
                        answers.push_back(Event::ViewNow(answer));
                    }
                }
                Action::Install { view, me } => {
                    let node = self.nodes.get_mut(&uid).expect("node");
                    assert_eq!(
                        view.members[me as usize].uid, uid,
                        "installs itself where the view says"
                    );
                    node.view = Some(view.clone());
                    answers.push_back(Event::Installed(Ok(Arc::new(Topology::new(&view, me)))));
                }
                Action::Resume {
                    old,
                    new,
                    plan,
                    rollback,
                } => {
                    assert_eq!(plan.node_map.len(), old.num_nodes() as usize);
                    assert_eq!(plan.node_map[old.my_node() as usize], Some(new.my_node()));
                    let members = self.nodes[&uid]
                        .view
                        .as_ref()
                        .expect("installed")
                        .members
                        .iter()
                        .map(|m| m.uid)
                        .collect();
                    let epoch = new.epoch();
                    self.resumed(uid);
                    let o = if rollback {
                        Outcome::RolledBack { epoch, members }
                    } else {
                        Outcome::Resumed { epoch, members }
                    };
                    self.outcome(uid, o);
                }
                Action::Recover { order } => {
                    let node = self.nodes.get_mut(&uid).expect("node");
                    // PEs stopped (or stopping) for a rescale stop once;
                    // stopped ones take the recovery's as they resume.
                    if node.stopping {
                        node.stop_queued = Some(order);
                    } else {
                        self.stop(uid, &order);
                    }
                }
                Action::Discard => {
                    // A stop queued for stopped PEs goes with the inboxes.
                    self.nodes.get_mut(&uid).expect("node").stop_queued = None;
                    // Every frame of the old epoch between live nodes is in.
                    let me = &self.nodes[&uid];
                    let e = me.epoch();
                    let complete = self.nodes.values().filter(|n| n.alive).all(|n| {
                        n.sent.get(&(e, uid)).copied().unwrap_or(0)
                            == me.received.get(&(e, n.uid)).copied().unwrap_or(0)
                    });
                    self.nodes
                        .get_mut(&uid)
                        .expect("node")
                        .late_complete
                        .push(complete);
                }
                Action::Joined { me } => {
                    self.resumed(uid);
                    let view = self.nodes[&uid].view.clone().expect("installed");
                    assert_eq!(view.members[me as usize].uid, uid);
                    let members = view.members.iter().map(|m| m.uid).collect();
                    self.outcome(
                        uid,
                        Outcome::Joined {
                            epoch: view.epoch,
                            members,
                        },
                    );
                }
                Action::Depart => {
                    self.outcome(uid, Outcome::Departed);
                    self.nodes.get_mut(&uid).expect("node").alive = false;
                }
                Action::Fail(f) => {
                    self.outcome(uid, Outcome::Failed(f));
                    // The node aborts and its process ends: the coordinator
                    // tells everyone else.
                    self.kill(uid);
                }
                Action::PeerLost { node, uid: lost } => {
                    let view = self.nodes[&uid].view.clone().expect("a member");
                    assert_eq!(
                        view.by_uid(lost).map(|m| m.node),
                        Some(node),
                        "the lost member is named by its id in this node's view"
                    );
                    self.outcome(uid, Outcome::Lost { uid: lost });
                    self.kill(uid);
                }
            }
        }
    }

    /// Node `uid`'s PEs stop for `order`, once each.
    fn stop(&mut self, uid: u64, order: &StopOrder) {
        let node = self.nodes.get_mut(&uid).expect("node");
        node.stopping = true;
        for _ in 0..node.pes {
            let e = Event::PeStopped(order.clone());
            self.push(Src::Local, uid, Item::Event(e));
        }
    }

    /// Node `uid`'s PEs run again; a recovery's stop queued meanwhile
    /// stops them at once.
    fn resumed(&mut self, uid: u64) {
        let node = self.nodes.get_mut(&uid).expect("node");
        node.stopping = false;
        if let Some(order) = node.stop_queued.take() {
            self.stop(uid, &order);
        }
    }

    fn outcome(&mut self, uid: u64, o: Outcome) {
        self.nodes.get_mut(&uid).expect("node").outcomes.push(o);
    }

    /// A process ends: its frames stop, the coordinator reports it lost
    /// (a member) or forgets it (a newcomer).
    fn kill(&mut self, uid: u64) {
        let node = self.nodes.get_mut(&uid).expect("node");
        if !node.alive {
            return;
        }
        node.alive = false;
        self.pending.retain(|&p| p != uid);
        if let Some(m) = self.view.by_uid(uid) {
            self.lost.push(uid);
            let lost = ServerMsg::MemberLost {
                epoch: self.view.epoch,
                node: m.node,
                uid,
            };
            let others: Vec<u64> = self.nodes.keys().copied().filter(|&u| u != uid).collect();
            for u in others {
                self.push(
                    Src::Coordinator,
                    u,
                    Item::Event(Event::Coordinator(lost.clone())),
                );
            }
        }
    }

    fn commit(&mut self, epoch: u64, remove: &[NodeId], admit: u32) -> Result<View, Unanswered> {
        if self.faults.refuse_commit {
            return Err(Unanswered::Refused("refused by the scenario".into()));
        }
        if epoch != self.view.epoch {
            return Err(Unanswered::Refused(format!("stale epoch {epoch}")));
        }
        if admit as usize > self.pending.len() {
            return Err(Unanswered::NewcomerGone(format!(
                "{admit} newcomers asked for, {} waiting",
                self.pending.len()
            )));
        }
        if let Some(m) = self
            .view
            .members
            .iter()
            .find(|m| self.lost.contains(&m.uid) && !remove.contains(&m.node))
        {
            return Err(Unanswered::MemberLost(format!(
                "node {} (uid {}) was lost",
                m.node, m.uid
            )));
        }
        self.lost.clear();
        let admitted: Vec<Member> = self
            .pending
            .drain(..admit as usize)
            .map(|uid| member(0, uid, 2))
            .collect();
        let mut next = self
            .view
            .renumbered(remove, &admitted)
            .expect("a valid commit");
        next.epoch = self.view.epoch + 1;
        for &r in remove {
            let uid = self.view.members[r as usize].uid;
            let die = ServerMsg::Die { epoch: next.epoch };
            self.push(Src::Coordinator, uid, Item::Event(Event::Coordinator(die)));
        }
        for m in &next.members {
            if admitted.iter().any(|a| a.uid == m.uid) {
                let msg = ServerMsg::Integrate {
                    node: m.node,
                    view: next.clone(),
                };
                self.push(
                    Src::Coordinator,
                    m.uid,
                    Item::Event(Event::Coordinator(msg)),
                );
            }
        }
        self.views.insert(next.epoch, next.clone());
        self.view = next.clone();
        Ok(next)
    }

    /// Delivers one item of a random non-empty link; false when none.
    fn step(&mut self) -> bool {
        let ready: Vec<(Src, u64)> = self
            .links
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(k, _)| *k)
            .collect();
        if ready.is_empty() {
            return false;
        }
        let key = ready[self.rng.gen_range(0..ready.len())];
        let item = self
            .links
            .get_mut(&key)
            .and_then(VecDeque::pop_front)
            .expect("non-empty");
        self.now += Duration::from_micros(self.rng.gen_range(0..500));
        let (_, to) = key;
        if !self.nodes[&to].alive {
            return true;
        }
        match item {
            Item::Envelope { from, epoch } => {
                let node = self.nodes.get_mut(&to).expect("node");
                *node.received.entry((epoch, from)).or_default() += 1;
                if node.draining {
                    let c = self.counts(to);
                    self.feed(to, Event::Counts(c));
                }
            }
            Item::Event(e) => self.feed(to, e),
        }
        true
    }

    /// Runs until nothing moves, firing deadlines when the network is idle.
    fn run(&mut self) {
        for _ in 0..1_000_000 {
            if self.step() {
                continue;
            }
            let next = self
                .nodes
                .values()
                .filter(|n| n.alive)
                .filter_map(|n| n.driver.next_deadline().map(|d| (d, n.uid)))
                .min();
            let Some((at, uid)) = next else {
                return;
            };
            // Admission waits of newcomers that were never admitted end the run.
            if at > self.now + Duration::from_secs(600) {
                return;
            }
            self.now = self.now.max(at);
            self.feed(uid, Event::Tick);
        }
        panic!("the simulation did not settle");
    }

    fn outcome_of(&self, uid: u64) -> Option<&Outcome> {
        self.nodes[&uid].outcomes.last()
    }

    fn members(&self) -> Vec<u64> {
        self.view.members.iter().map(|m| m.uid).collect()
    }
}

impl SimNode {
    fn epoch(&self) -> u64 {
        self.view.as_ref().map_or(0, |v| v.epoch)
    }

    fn new(uid: u64, pes: u32, driver: Driver, view: Option<View>) -> Self {
        SimNode {
            uid,
            pes,
            driver,
            view,
            alive: true,
            draining: false,
            sent: HashMap::new(),
            received: HashMap::new(),
            outcomes: Vec::new(),
            late_complete: Vec::new(),
            stages: Vec::new(),
            stopping: false,
            stop_queued: None,
        }
    }
}

/// Checks a rescale that should have succeeded: every survivor resumed and
/// every admitted newcomer joined in the same epoch with the same members;
/// removed nodes departed; nothing of the old epoch was lost or duplicated.
fn assert_rescaled(sim: &Sim, before: &[u64], removed: &[u64], epoch: u64) {
    let members = sim.members();
    assert_eq!(sim.view.epoch, epoch);
    for uid in before {
        let node = &sim.nodes[uid];
        if removed.contains(uid) {
            if sim.outcome_of(*uid).is_none() && !node.alive {
                // Killed after the commit removed it: nobody misses it.
                continue;
            }
            assert_eq!(
                sim.outcome_of(*uid),
                Some(&Outcome::Departed),
                "node uid {uid}"
            );
        } else {
            assert_eq!(
                sim.outcome_of(*uid),
                Some(&Outcome::Resumed {
                    epoch,
                    members: members.clone()
                }),
                "node uid {uid}"
            );
            assert!(!node.driver.busy());
        }
        assert!(
            !node.late_complete.is_empty() && node.late_complete.iter().all(|&c| c),
            "uid {uid}: every frame of the old epoch arrived, once: {:?}",
            node.late_complete
        );
    }
    for uid in members.iter().filter(|u| !before.contains(u)) {
        assert_eq!(
            sim.outcome_of(*uid),
            Some(&Outcome::Joined {
                epoch,
                members: members.clone()
            })
        );
    }
    let stages = &sim.nodes[&100].stages;
    assert!(!stages.is_empty());
    for s in stages.chunks(3) {
        assert_eq!(s, [Stage::Stop, Stage::Commit, Stage::Reconcile]);
    }
}

/// Checks a rescale that failed: every node that took part ended failed
/// (naming its step) or aborted, and none is still waiting.
fn assert_failed_everywhere(sim: &Sim, uids: &[u64]) -> Vec<Failure> {
    let mut failures = Vec::new();
    for uid in uids {
        let node = &sim.nodes[uid];
        assert!(!node.driver.busy() || !node.alive, "uid {uid} still waits");
        match node.outcomes.last() {
            Some(Outcome::Failed(f)) => {
                assert!(f.to_string().starts_with(&f.step.to_string()), "{f}");
                failures.push(f.clone());
            }
            Some(Outcome::Lost { .. }) => {}
            _ if !node.alive => {}
            other => panic!("uid {uid} ended {other:?}"),
        }
    }
    failures
}

fn uids(n: usize) -> Vec<u64> {
    (0..n as u64).map(|i| 100 + i).collect()
}

#[test]
fn every_stage_passes_at_1_2_4_and_16_nodes() {
    for drain in [DrainMode::Tree, DrainMode::AllToAll] {
        for n in [1usize, 2, 4, 16] {
            let pes: Vec<u32> = (0..n).map(|i| 1 + (i % 3) as u32).collect();
            // Expand by two.
            let mut sim = Sim::new(&pes, 2, drain, n as u64);
            sim.traffic(3);
            sim.rescale(vec![], 2);
            sim.run();
            assert_rescaled(&sim, &uids(n), &[], 8);
            if n == 1 {
                continue;
            }
            // Shrink by the last half.
            let mut sim = Sim::new(&pes, 0, drain, 10 + n as u64);
            sim.traffic(2);
            let remove: Vec<NodeId> = (n as u32 / 2..n as u32).filter(|&i| i > 0).collect();
            let removed: Vec<u64> = remove.iter().map(|&i| 100 + i as u64).collect();
            sim.rescale(remove, 0);
            sim.run();
            assert_rescaled(&sim, &uids(n), &removed, 8);
            // Both in one commit, then again from the new view.
            let mut sim = Sim::new(&pes, 3, drain, 20 + n as u64);
            sim.traffic(1);
            sim.rescale(vec![1], 1);
            sim.run();
            assert_rescaled(&sim, &uids(n), &[101], 8);
            let now = sim.members();
            sim.traffic(2);
            sim.rescale(vec![], 2);
            sim.run();
            assert_rescaled(&sim, &now, &[], 9);
        }
    }
}

/// Node 0 lives for the whole job (thousands of rescales on spot
/// capacity): nothing its driver keeps may grow with the rescales, the
/// newcomers (each a new uid) or the departed nodes. 300 rescales of random
/// kinds (expand, shrink, replace), each with frames in flight: after every
/// one, node 0 and every member keep no event for later and their frame
/// counts cover the current view only.
#[test]
fn node_0_keeps_nothing_per_rescale_newcomer_or_departed_node() {
    const RESCALES: u64 = 300;
    let mut sim = Sim::new(&[1, 2, 1], 0, DrainMode::Tree, 15);
    let mut next_uid = 2000;
    for i in 0..RESCALES {
        let n = sim.view.members.len() as u32;
        let kind = sim.rng.gen_range(0..3);
        let (remove, admit) = match kind {
            0 if n < 6 => (vec![], 1),
            1 if n > 2 => (vec![sim.rng.gen_range(1..n)], 0),
            _ => (vec![sim.rng.gen_range(1..n)], 1),
        };
        for _ in 0..admit {
            // A newcomer registers: a new uid each time.
            let driver = Driver::newcomer(cfg(2, DrainMode::Tree), sim.now);
            sim.nodes
                .insert(next_uid, SimNode::new(next_uid, 2, driver, None));
            sim.pending.push(next_uid);
            next_uid += 1;
        }
        let before = sim.members();
        let removed: Vec<u64> = remove.iter().map(|&k| before[k as usize]).collect();
        sim.traffic(1);
        sim.rescale(remove, admit);
        sim.run();
        assert_rescaled(&sim, &before, &removed, 8 + i);
        let nodes = sim.view.members.len();
        for uid in sim.members() {
            let d = &sim.nodes[&uid].driver;
            assert!(
                d.early.is_empty(),
                "rescale {i}: uid {uid} keeps {} events",
                d.early.len()
            );
            assert!(d.counts.sent.len() <= nodes && d.counts.received.len() <= nodes);
            assert!(!d.busy() && d.next_deadline().is_none());
        }
    }
    assert_eq!(sim.nodes[&100].stages.len() as u64, 3 * RESCALES);
}

#[test]
fn a_peer_that_never_answers_the_drain_fails_it_by_name() {
    let mut sim = Sim::new(&[1, 1, 1, 1], 0, DrainMode::Tree, 3);
    fn drain(f: &ControlFrame) -> bool {
        matches!(f, ControlFrame::DrainUp { .. } | ControlFrame::Drain { .. })
    }
    sim.faults.silent = Some((103, drain));
    sim.traffic(2);
    sim.rescale(vec![2], 0);
    sim.run();
    let failures = assert_failed_everywhere(&sim, &uids(4));
    // Whoever's deadline fired first named the first drain round (its
    // parent's counts or the totals that never came down); the others
    // heard that node was lost.
    let timed_out: Vec<&Failure> = failures
        .iter()
        .filter(|f| matches!(f.cause, Cause::TimedOut(_)))
        .collect();
    assert!(!timed_out.is_empty(), "a deadline fired: {failures:?}");
    for f in timed_out {
        assert!(
            matches!(
                f.step,
                Step::DrainCounts { round: 1, .. } | Step::DrainTotals { round: 1, .. }
            ),
            "{f}"
        );
        assert!(f.to_string().starts_with("drain round 1"), "{f}");
        assert_eq!(f.cause, Cause::TimedOut(STEP));
    }
    assert_eq!(sim.view.epoch, 7, "nothing was committed");
}

#[test]
fn a_peer_that_never_answers_the_barrier_fails_it_by_name() {
    let mut sim = Sim::new(&[2, 2, 2, 2], 1, DrainMode::Tree, 4);
    fn ready(f: &ControlFrame) -> bool {
        matches!(f, ControlFrame::Ready)
    }
    // The newcomer (node 3 of the new view, a leaf) never says ready.
    sim.faults.silent = Some((1000, ready));
    sim.rescale(vec![1], 1);
    sim.run();
    let failures = assert_failed_everywhere(&sim, &[100, 102, 103, 1000]);
    assert_eq!(sim.outcome_of(101), Some(&Outcome::Departed));
    let timed_out: Vec<&Failure> = failures
        .iter()
        .filter(|f| matches!(f.cause, Cause::TimedOut(_)))
        .collect();
    assert!(!timed_out.is_empty());
    for f in timed_out {
        assert!(
            matches!(f.step, Step::BarrierReady | Step::BarrierGo),
            "{f}"
        );
        assert!(f.to_string().contains("the barrier"), "{f}");
    }
}

#[test]
fn a_member_lost_in_each_stage_fails_the_rescale_everywhere() {
    // When node uid 102 dies: as the first PE hands over (stop), as node 0
    // commits (commit), as the first node installs the view (reconcile).
    let stages: [(&str, fn(&Action) -> bool); 4] = [
        ("stop", |a| matches!(a, Action::Draining(true))),
        ("hand-over", |a| matches!(a, Action::HandOver { .. })),
        ("commit", |a| matches!(a, Action::Commit { .. })),
        ("reconcile", |a| matches!(a, Action::Install { .. })),
    ];
    for (name, when) in stages {
        for drain in [DrainMode::Tree, DrainMode::AllToAll] {
            let mut sim = Sim::new(&[1, 2, 1, 2, 1], 1, drain, 5);
            sim.faults.kill = Some((102, when));
            sim.traffic(2);
            sim.rescale(vec![4], 1);
            sim.run();
            let took_part = [100, 101, 103, 1000];
            // The newcomer takes part once the commit admits it; before,
            // a member's loss is not its to fail on: it still waits (and
            // gives up at its admission deadline when the job has ended).
            let newcomer = &sim.nodes[&1000];
            if newcomer.outcomes.is_empty() {
                assert_eq!(newcomer.driver.state_name(), "admission", "{name}");
                assert_failed_everywhere(&sim, &took_part[..3]);
            } else {
                assert_failed_everywhere(&sim, &took_part);
            }
            let heard = took_part.iter().any(|u| match sim.outcome_of(*u) {
                Some(Outcome::Failed(f)) => f.cause == Cause::MemberLost { node: 2, uid: 102 },
                Some(Outcome::Lost { uid }) => *uid == 102,
                _ => false,
            });
            assert!(heard, "{name}: nobody heard of the lost node");
            // Nobody went on in a new epoch as if nothing had happened.
            for uid in took_part {
                assert!(
                    !matches!(
                        sim.outcome_of(uid),
                        Some(Outcome::Resumed { .. } | Outcome::Joined { .. })
                    ),
                    "{name}: uid {uid} went on"
                );
            }
        }
    }
}

#[test]
fn a_member_lost_in_a_rescale_is_named_with_the_step_by_every_node() {
    // uid 102 dies as node 0 commits: every node waits in a step of its
    // own (a survivor for the new view, the departing node for its Die).
    let mut sim = Sim::new(&[1, 1, 1, 1], 0, DrainMode::Tree, 11);
    sim.faults.kill = Some((102, |a| matches!(a, Action::Commit { .. })));
    sim.rescale(vec![3], 0);
    sim.run();
    let failures = assert_failed_everywhere(&sim, &[100, 101, 103]);
    let lost: Vec<&Failure> = failures
        .iter()
        .filter(|f| f.cause == Cause::MemberLost { node: 2, uid: 102 })
        .collect();
    assert!(!lost.is_empty(), "{failures:?}");
    for f in lost {
        let line = f.to_string();
        assert!(line.starts_with(&f.step.to_string()), "{line}");
        assert!(
            line.ends_with("node 2 (uid 102) was lost during the rescale"),
            "{line}"
        );
    }
}

#[test]
fn a_member_lost_outside_a_rescale_is_a_loss_not_a_failed_rescale() {
    let mut sim = Sim::new(&[1, 2, 1], 0, DrainMode::Tree, 12);
    sim.kill(102);
    sim.run();
    for uid in [100, 101] {
        assert_eq!(sim.outcome_of(uid), Some(&Outcome::Lost { uid: 102 }));
        assert!(!sim.nodes[&uid].driver.busy());
    }
}

impl Sim {
    /// Turns node-loss recovery on in every driver.
    fn recovering(mut self) -> Sim {
        for n in self.nodes.values_mut() {
            n.driver.cfg.recover = true;
        }
        self
    }
}

#[test]
fn a_member_lost_with_recovery_on_is_recovered_without_it_everywhere() {
    for drain in [DrainMode::Tree, DrainMode::AllToAll] {
        for n in [2usize, 3, 6, 16] {
            let pes: Vec<u32> = (0..n).map(|i| 1 + (i % 3) as u32).collect();
            let mut sim = Sim::new(&pes, 0, drain, 30 + n as u64).recovering();
            sim.traffic(3);
            let victim = 100 + n as u64 - 1 - (n as u64 / 3);
            sim.kill(victim);
            sim.run();
            let survivors: Vec<u64> = uids(n).into_iter().filter(|&u| u != victim).collect();
            assert_eq!(sim.view.epoch, 8, "{drain:?} at {n}");
            assert_eq!(sim.members(), survivors);
            for uid in &survivors {
                let node = &sim.nodes[uid];
                assert_eq!(
                    node.outcomes,
                    vec![Outcome::RolledBack {
                        epoch: 8,
                        members: survivors.clone()
                    }],
                    "{drain:?} at {n}: uid {uid}"
                );
                assert_eq!(
                    node.late_complete,
                    vec![true],
                    "uid {uid}: every frame between survivors arrived before the discard"
                );
                assert!(!node.driver.busy());
            }
            let stages = &sim.nodes[&100].stages;
            assert_eq!(stages, &[Stage::Stop, Stage::Commit, Stage::Reconcile]);
        }
    }
}

#[test]
fn a_member_lost_with_recovery_on_after_a_rescale_is_recovered_in_the_new_view() {
    let mut sim = Sim::new(&[1, 2, 1, 2], 1, DrainMode::Tree, 40);
    sim.rescale(vec![1], 1);
    sim.run();
    assert_rescaled(&sim, &uids(4), &[101], 8);
    // The newcomer (uid 1000) is node 3 of epoch 8; node 1 (uid 102) is lost.
    let mut sim = sim.recovering();
    sim.traffic(2);
    sim.kill(102);
    sim.run();
    assert_eq!(sim.view.epoch, 9);
    assert_eq!(sim.members(), vec![100, 103, 1000]);
    for uid in [100, 103, 1000] {
        assert!(
            matches!(
                sim.outcome_of(uid),
                Some(Outcome::RolledBack { epoch: 9, .. })
            ),
            "uid {uid}: {:?}",
            sim.outcome_of(uid)
        );
    }
}

/// Newcomers waiting when a member is lost (replacements launched before
/// the loss) join in the recovery's commit, in both drain modes.
#[test]
fn a_recovery_admits_the_newcomers_waiting_in_its_commit() {
    for drain in [DrainMode::Tree, DrainMode::AllToAll] {
        let mut sim = Sim::new(&[1, 2, 1], 2, drain, 43).recovering();
        sim.traffic(3);
        sim.kill(102);
        sim.run();
        let members = vec![100, 101, 1000, 1001];
        assert_eq!(sim.view.epoch, 8, "{drain:?}");
        assert_eq!(sim.members(), members, "{drain:?}");
        assert!(sim.pending.is_empty(), "{drain:?}: nobody left waiting");
        for uid in [100, 101] {
            assert_eq!(
                sim.nodes[&uid].outcomes,
                vec![Outcome::RolledBack {
                    epoch: 8,
                    members: members.clone()
                }],
                "{drain:?}: uid {uid}"
            );
        }
        for uid in [1000, 1001] {
            assert_eq!(
                sim.outcome_of(uid),
                Some(&Outcome::Joined {
                    epoch: 8,
                    members: members.clone()
                }),
                "{drain:?}: uid {uid}"
            );
        }
        assert_eq!(sim.queries, 1, "{drain:?}: node 0 asked how many wait");
    }
    // With nobody waiting, the recovery commits the removal alone.
    let mut sim = Sim::new(&[1, 1, 1], 0, DrainMode::Tree, 44).recovering();
    sim.kill(101);
    sim.run();
    assert_eq!(sim.members(), vec![100, 102]);
}

/// How a rescale with recovery on ended everywhere when a member was lost
/// in it: the rescale made (every survivor resumed) or abandoned for a
/// recovery (every survivor rolled back), the same on every node, in epoch
/// 8 with `members`; the newcomers joined. Returns whether it recovered.
fn recovered_or_rescaled(sim: &Sim, members: &[u64], newcomers: &[u64], what: &str) -> bool {
    assert_eq!(sim.view.epoch, 8, "{what}");
    assert_eq!(sim.members(), members, "{what}");
    let old: Vec<u64> = members
        .iter()
        .copied()
        .filter(|u| !newcomers.contains(u))
        .collect();
    let rolled_back = matches!(sim.outcome_of(100), Some(Outcome::RolledBack { .. }));
    for uid in &old {
        let members = members.to_vec();
        let want = if rolled_back {
            Outcome::RolledBack { epoch: 8, members }
        } else {
            Outcome::Resumed { epoch: 8, members }
        };
        assert_eq!(sim.nodes[uid].outcomes, vec![want], "{what}: uid {uid}");
        assert!(!sim.nodes[uid].driver.busy(), "{what}: uid {uid}");
    }
    for uid in newcomers {
        assert!(
            matches!(sim.outcome_of(*uid), Some(Outcome::Joined { epoch: 8, .. })),
            "{what}: newcomer {uid}: {:?}",
            sim.outcome_of(*uid)
        );
    }
    rolled_back
}

/// With recovery on, a member lost during a rescale that has no new view
/// yet does not end the job. A survivor lost before the commit is made
/// (in the drains, at the hand-over, under node 0's query or its commit,
/// which the coordinator refuses for the loss) turns the rescale into a
/// recovery everywhere: the departing node stays, the lost one goes, the
/// newcomer the rescale was to admit joins in the recovery's commit. A
/// departing node lost before it handed over does the same; lost at the
/// commit, after its hand-over, the rescale that removes it is made.
#[test]
fn a_member_lost_in_a_rescale_before_its_commit_is_recovered_from_everywhere() {
    let stages: [(&str, fn(&Action) -> bool); 5] = [
        ("stop", |a| matches!(a, Action::Draining(true))),
        ("hand-over", |a| matches!(a, Action::HandOver { .. })),
        ("second drain", |a| matches!(a, Action::TakeLate)),
        ("query", |a| matches!(a, Action::QueryPending { .. })),
        ("commit", |a| matches!(a, Action::Commit { .. })),
    ];
    for (name, when) in stages {
        for drain in [DrainMode::Tree, DrainMode::AllToAll] {
            // A survivor: the rescale cannot be made without it.
            let mut sim = Sim::new(&[1, 2, 1, 2, 1], 1, drain, 5).recovering();
            sim.faults.kill = Some((102, when));
            sim.traffic(2);
            sim.rescale(vec![4], 1);
            sim.run();
            let what = format!("survivor lost at {name}, {drain:?}");
            let members = [100, 101, 103, 104, 1000];
            assert!(
                recovered_or_rescaled(&sim, &members, &[1000], &what),
                "{what}: it recovered"
            );
            // The departing node: either way it is gone, and nothing else.
            let mut sim = Sim::new(&[1, 2, 1, 2, 1], 1, drain, 6).recovering();
            sim.faults.kill = Some((104, when));
            sim.traffic(2);
            sim.rescale(vec![4], 1);
            sim.run();
            let what = format!("departing node lost at {name}, {drain:?}");
            let members = [100, 101, 102, 103, 1000];
            let recovered = recovered_or_rescaled(&sim, &members, &[1000], &what);
            if name == "commit" {
                assert!(!recovered, "{what}: the commit that removes it was made");
            }
            if name == "stop" {
                assert!(recovered, "{what}: its work was not handed over");
            }
        }
    }
}

/// With recovery on, a survivor lost after the commit was made (the
/// coordinator had not heard of it yet), as node 0 installs the new view
/// or as the first node passes its barrier: the barrier cannot complete
/// without it, so node 0 resumes without it and recovers in the new view,
/// telling every node to do the same. The departing node is gone, the
/// newcomer the rescale admitted stays, the one still waiting joins.
#[test]
fn a_member_lost_after_the_commit_is_recovered_from_in_the_new_view() {
    let points: [(&str, fn(&Action) -> bool); 3] = [
        // Before node 0 sends the committed view to the survivors: its
        // View to the lost node may fail before node 0 has installed it.
        ("view", |a| {
            matches!(
                a,
                Action::Send {
                    frame: ControlFrame::View(_),
                    ..
                }
            )
        }),
        ("install", |a| matches!(a, Action::Install { .. })),
        ("barrier", |a| {
            matches!(
                a,
                Action::Send {
                    frame: ControlFrame::Ready,
                    ..
                }
            )
        }),
    ];
    let made = vec![100, 101, 102, 103, 1000];
    let members = vec![100, 101, 103, 1000, 1001];
    for (name, when) in points {
        for (drain, fail) in [DrainMode::Tree, DrainMode::AllToAll]
            .into_iter()
            .flat_map(|d| [(d, false), (d, true)])
        {
            let what = format!("lost at the {name}, {drain:?}, sends to it fail: {fail}");
            let mut sim = Sim::new(&[1, 2, 1, 2, 1], 2, drain, 21).recovering();
            sim.faults.kill = Some((102, when));
            sim.faults.sends_to_dead_fail = fail;
            sim.rescale(vec![4], 1);
            sim.run();
            assert_eq!(sim.view.epoch, 9, "{what}");
            assert_eq!(sim.members(), members, "{what}");
            let rolled_back = Outcome::RolledBack {
                epoch: 9,
                members: members.clone(),
            };
            for uid in [100, 101, 103] {
                let resumed = Outcome::Resumed {
                    epoch: 8,
                    members: made.clone(),
                };
                let want = vec![resumed, rolled_back.clone()];
                assert_eq!(sim.nodes[&uid].outcomes, want, "{what}: uid {uid}");
            }
            let joined = Outcome::Joined {
                epoch: 8,
                members: made.clone(),
            };
            let want = vec![joined, rolled_back.clone()];
            assert_eq!(sim.nodes[&1000].outcomes, want, "{what}");
            assert!(
                matches!(sim.outcome_of(1001), Some(Outcome::Joined { epoch: 9, .. })),
                "{what}"
            );
            assert_eq!(sim.nodes[&104].outcomes, vec![Outcome::Departed], "{what}");
            for uid in &members {
                assert!(!sim.nodes[uid].driver.busy(), "{what}: uid {uid}");
            }
        }
    }
}

/// A member lost while node 0 learns the outcome of a commit whose
/// connection ended before the coordinator read it: the coordinator's view
/// says nothing was committed, and node 0 recovers without the lost node
/// instead of committing again.
#[test]
fn a_loss_while_node_0_learns_a_lost_commit_s_outcome_is_recovered_from() {
    let mut sim = Sim::new(&[1, 1, 1], 0, DrainMode::Tree, 13).recovering();
    sim.faults.lose_commits = 1;
    sim.faults.view_after_notices = true;
    sim.faults.kill = Some((102, |a| matches!(a, Action::AskView { .. })));
    sim.rescale(vec![1], 0);
    sim.run();
    assert!(recovered_or_rescaled(&sim, &[100, 101], &[], "outcome"));
    assert_eq!(sim.views_asked, 1);
    assert_eq!(sim.commits, 2, "the rescale's, lost; the recovery's");
}

/// A `Recover` frame that names node 0 or no node of the view is dropped,
/// saying so: the node neither panics nor starts a recovery.
#[test]
fn a_recover_frame_naming_no_node_but_node_0_is_dropped() {
    let sim = Sim::new(&[1, 1, 1], 0, DrainMode::Tree, 14).recovering();
    let mut driver = Driver::member(
        sim.nodes[&101].driver.cfg,
        Arc::new(Topology::new(&sim.view, 1)),
    );
    for lost in [0, 3, NodeId::MAX] {
        let frame = Event::Frame {
            src: 0,
            epoch_bits: sim.view.epoch & 0xffff,
            frame: ControlFrame::Recover { lost },
        };
        let actions = driver.on_event(frame, sim.now);
        assert!(actions.is_empty(), "{lost}: {actions:?}");
        assert!(!driver.busy(), "{lost}");
    }
}

/// The commit's answer comes before the coordinator's notice of the loss
/// it was refused for (they travel apart in the node): node 0 waits for the
/// notice, then recovers. Without recovery the refusal ends the rescale.
#[test]
fn a_commit_refused_for_a_loss_not_yet_heard_of_waits_for_its_notice() {
    let mut sim = Sim::new(&[1, 1, 1], 0, DrainMode::Tree, 9).recovering();
    // The kill is noticed by the coordinator alone: its notices queue.
    sim.faults.kill = Some((102, |a| matches!(a, Action::Commit { .. })));
    sim.rescale(vec![1], 0);
    sim.run();
    assert!(recovered_or_rescaled(&sim, &[100, 101], &[], "refused"));
    assert_eq!(
        sim.commits, 2,
        "the rescale's commit, refused; the recovery's"
    );
}

#[test]
fn node_0_lost_or_a_second_loss_in_a_recovery_ends_the_job_naming_it() {
    // Node 0's loss is no recovery: every survivor reports the loss.
    let mut sim = Sim::new(&[1, 1, 1], 0, DrainMode::Tree, 41).recovering();
    sim.kill(100);
    sim.run();
    for uid in [101, 102] {
        assert_eq!(sim.outcome_of(uid), Some(&Outcome::Lost { uid: 100 }));
    }
    assert_eq!(sim.view.epoch, 7);
    // A second loss while the survivors drain fails the recovery everywhere.
    let mut sim = Sim::new(&[1, 1, 1, 1, 1], 0, DrainMode::Tree, 42).recovering();
    sim.faults.kill = Some((103, |a| matches!(a, Action::Draining(true))));
    sim.traffic(2);
    sim.kill(104);
    sim.run();
    let failures = assert_failed_everywhere(&sim, &[100, 101, 102]);
    assert!(
        failures
            .iter()
            .any(|f| f.cause == Cause::MemberLost { node: 3, uid: 103 }),
        "{failures:?}"
    );
    assert!(
        failures.iter().all(|f| f.recovering == Some(4)),
        "each failure says which loss it was recovering from: {failures:?}"
    );
    for uid in [100, 101, 102] {
        assert!(
            !matches!(sim.outcome_of(uid), Some(Outcome::RolledBack { .. })),
            "uid {uid} went on"
        );
    }
    assert_eq!(sim.view.epoch, 7, "nothing was committed");
}

#[test]
fn a_refused_commit_fails_the_rescale_everywhere() {
    let mut sim = Sim::new(&[1, 1, 1], 1, DrainMode::Tree, 6);
    sim.faults.refuse_commit = true;
    sim.traffic(1);
    sim.rescale(vec![2], 1);
    sim.run();
    let failures = assert_failed_everywhere(&sim, &uids(3));
    let zero = failures
        .iter()
        .find(|f| f.step == Step::Commit)
        .expect("node 0 failed its commit");
    assert!(
        zero.to_string()
            .contains("the coordinator refused the commit: refused by the scenario"),
        "{zero}"
    );
    assert!(failures.iter().all(|f| f.recovering.is_none()));
    assert_eq!(sim.view.epoch, 7, "nothing was committed");
}

#[test]
fn a_newcomer_vanishing_between_query_and_commit_is_asked_for_again() {
    let mut sim = Sim::new(&[1, 1], 3, DrainMode::Tree, 7);
    sim.faults.vanish_after_query = 1;
    sim.traffic(2);
    sim.rescale(vec![], 3);
    sim.run();
    assert_rescaled(&sim, &uids(2), &[], 8);
    assert_eq!(
        sim.members(),
        vec![100, 101, 1001, 1002],
        "the two left are admitted"
    );
}

#[test]
fn newcomers_all_vanishing_leave_a_commit_without_them() {
    let mut sim = Sim::new(&[1, 1], 2, DrainMode::Tree, 8);
    sim.faults.vanish_after_query = 2;
    sim.rescale(vec![], 2);
    sim.run();
    // With none left, the second query finds none and commits without them.
    assert_rescaled(&sim, &uids(2), &[], 8);
    assert_eq!(sim.members(), vec![100, 101]);
}

/// The coordinator connection ends under node 0's commit before the
/// coordinator read it (it was lost, and restarted: node 0 restored it
/// with the view it left). Node 0 asks the view, finds the epoch it left,
/// and commits again: the rescale completes, once, everywhere.
#[test]
fn a_commit_lost_before_the_coordinator_read_it_is_made_again() {
    let mut sim = Sim::new(&[1, 2, 1, 1], 1, DrainMode::Tree, 21);
    sim.faults.lose_commits = 1;
    sim.traffic(2);
    sim.rescale(vec![2], 1);
    sim.run();
    assert_rescaled(&sim, &uids(4), &[102], 8);
    assert_eq!(sim.members(), vec![100, 101, 103, 1000]);
    assert_eq!((sim.commits, sim.views_asked), (2, 1));
    assert_eq!(
        sim.queries, 2,
        "newcomers are asked for again before the second commit"
    );
}

/// The coordinator made node 0's commit (the departing node got its Die,
/// the newcomer its Integrate) but the connection ended before the
/// answer: node 0 learns the outcome from the view (the next epoch, as
/// its commit makes it) and goes on with it, without a second commit.
#[test]
fn a_commit_made_before_its_connection_ended_is_learned_not_made_twice() {
    let mut sim = Sim::new(&[1, 1, 1], 1, DrainMode::Tree, 22);
    sim.faults.lose_after_made = true;
    sim.traffic(2);
    sim.rescale(vec![1], 1);
    sim.run();
    assert_rescaled(&sim, &uids(3), &[101], 8);
    assert_eq!(sim.members(), vec![100, 102, 1000]);
    assert_eq!((sim.commits, sim.views_asked), (1, 1));
}

/// A query for newcomers whose connection ended is asked again: it
/// changes nothing at the coordinator.
#[test]
fn a_query_lost_with_its_connection_is_asked_again() {
    let mut sim = Sim::new(&[1, 1], 2, DrainMode::AllToAll, 23);
    sim.faults.lose_queries = 1;
    sim.rescale(vec![], 2);
    sim.run();
    assert_rescaled(&sim, &uids(2), &[], 8);
    assert_eq!((sim.queries, sim.commits), (2, 1));
}

/// When node 0 cannot learn the outcome, the rescale fails everywhere,
/// within the bound, naming the step and saying what is unknown: never
/// "refused", and no node guesses.
#[test]
fn a_commit_whose_outcome_cannot_be_learned_fails_naming_the_step() {
    let mut sim = Sim::new(&[1, 1, 1], 0, DrainMode::Tree, 24);
    sim.faults.lose_commits = 1;
    sim.faults.view_unreachable = true;
    sim.traffic(1);
    sim.rescale(vec![2], 0);
    sim.run();
    let failures = assert_failed_everywhere(&sim, &uids(3));
    let zero = failures
        .iter()
        .find(|f| f.step == Step::CommitOutcome)
        .expect("node 0 failed learning the outcome");
    let text = zero.to_string();
    assert!(text.contains("could not be learned"), "{text}");
    assert!(text.contains("did not answer within"), "{text}");
    assert!(!text.contains("refused"), "{text}");
    assert_eq!(sim.view.epoch, 7, "nothing was committed");
}

/// Connections ending under every commit: node 0 gives up after its tries
/// and says how often.
#[test]
fn connections_ending_under_every_commit_end_the_rescale_after_the_tries() {
    let mut sim = Sim::new(&[1, 1], 0, DrainMode::Tree, 25);
    sim.faults.lose_commits = u32::MAX;
    sim.rescale(vec![1], 0);
    sim.run();
    let failures = assert_failed_everywhere(&sim, &uids(2));
    let zero = failures
        .iter()
        .find(|f| f.step == Step::Commit)
        .expect("node 0 failed its commit");
    assert!(
        zero.to_string()
            .contains("the coordinator connection ended under the commit 3 times"),
        "{zero}"
    );
    assert_eq!((sim.commits, sim.views_asked), (3, 3));
    assert_eq!(sim.view.epoch, 7, "nothing was committed");
}

#[test]
fn late_frames_of_the_old_epoch_are_dropped_not_taken() {
    let mut sim = Sim::new(&[1, 1, 1], 0, DrainMode::Tree, 9);
    sim.rescale(vec![2], 0);
    sim.run();
    assert_rescaled(&sim, &uids(3), &[102], 8);
    // Late duplicates of epoch 7 reach node 0 (uid 100), which is node 0 of
    // epoch 8 with one child: they must not stand in for epoch 8's frames.
    for frame in [
        ControlFrame::DrainUp {
            round: 1,
            sent: vec![0, 0],
        },
        ControlFrame::DrainDown {
            round: 1,
            totals: vec![0, 0],
        },
        ControlFrame::Ready,
        ControlFrame::Go,
    ] {
        sim.push(
            Src::Node(101),
            100,
            Item::Event(Event::Frame {
                src: 1,
                epoch_bits: 7,
                frame,
            }),
        );
    }
    sim.run();
    assert!(
        sim.nodes[&100].driver.early.is_empty(),
        "stale frames are not kept"
    );
    // The next rescale's drain must wait for node 1's real counts: it
    // never sends them, so the deadline fires in drain round 1.
    fn drain(f: &ControlFrame) -> bool {
        matches!(f, ControlFrame::DrainUp { .. })
    }
    sim.faults.silent = Some((101, drain));
    sim.rescale(vec![1], 0);
    sim.run();
    let failures = assert_failed_everywhere(&sim, &[100, 101]);
    assert!(
        failures.iter().any(|f| f.cause == Cause::TimedOut(STEP)
            && matches!(f.step, Step::DrainCounts { round: 1, node: 0 })),
        "{failures:?}"
    );
}

#[test]
fn counts_of_another_view_or_that_overflow_are_refused() {
    let mut sum = vec![1, 2, 3];
    let e = add_counts(&mut sum, &[1, 2], 4).unwrap_err();
    assert!(
        e.to_string()
            .contains("node 4: 2 counts for a view of 3 nodes"),
        "{e}"
    );
    assert_eq!(
        add_counts(&mut sum, &[0, u64::MAX, 0], 1),
        Err(Cause::Overflow { src: 1 })
    );
    add_counts(&mut sum, &[1, 0, 1], 2).unwrap();
    assert_eq!(sum[0], 2);
}

#[test]
fn a_newcomer_that_is_never_admitted_gives_up_at_its_deadline() {
    let now = Instant::now();
    let mut d = Driver::newcomer(cfg(1, DrainMode::Tree), now);
    assert_eq!(d.next_deadline(), Some(now + Duration::from_secs(3600)));
    assert!(d
        .on_event(Event::Tick, now + Duration::from_secs(10))
        .is_empty());
    let out = d.on_event(Event::Tick, now + Duration::from_secs(3600));
    match &out[..] {
        [Action::Fail(f)] => assert_eq!(
            f,
            &Failure {
                step: Step::Admission,
                cause: Cause::TimedOut(Duration::from_secs(3600)),
                recovering: None,
            }
        ),
        other => panic!("{other:?}"),
    }
    assert!(!d.busy());
}

/// Which fault a proptest case injects.
#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    Kill {
        victim: usize,
        at: u8,
    },
    Silent {
        victim: usize,
    },
    Refuse,
    /// Node 0's connection ends under its first commit, before the
    /// coordinator read it (`made` false) or after it made it.
    LoseCommit {
        made: bool,
    },
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        3 => Just(Fault::None),
        2 => (0usize..8, 0u8..6).prop_map(|(victim, at)| Fault::Kill { victim, at }),
        1 => (0usize..8).prop_map(|victim| Fault::Silent { victim }),
        1 => Just(Fault::Refuse),
        1 => any::<bool>().prop_map(|made| Fault::LoseCommit { made }),
    ]
}

/// The job of a property case (`pes`, `newcomers` waiting, drain mode
/// `tree` or all-to-all) and the nodes `picks` marks for removal (never
/// node 0); rejected when the request would change nothing.
fn case_job(
    pes: &[u32],
    picks: &[bool],
    newcomers: usize,
    admit: u32,
    tree: bool,
    seed: u64,
) -> Result<(Sim, Vec<NodeId>), TestCaseError> {
    let remove: Vec<NodeId> = (1..pes.len() as u32)
        .filter(|&i| picks[i as usize])
        .collect();
    if remove.is_empty() && admit == 0 {
        return Err(TestCaseError::reject("a request that changes nothing"));
    }
    let drain = if tree {
        DrainMode::Tree
    } else {
        DrainMode::AllToAll
    };
    Ok((Sim::new(pes, newcomers, drain, seed), remove))
}

/// One case of the interleaving property: events interleaved at random
/// (any link's frame may come next), with or without a fault: every node
/// ends in the same epoch with the same members and every frame of the old
/// epoch arrived exactly once, or the rescale failed everywhere, each node
/// naming its step. No node is left waiting.
#[allow(clippy::too_many_arguments)]
fn interleaving_case(
    pes: Vec<u32>,
    picks: Vec<bool>,
    newcomers: usize,
    admit: u32,
    traffic: u64,
    tree: bool,
    fault: Fault,
    seed: u64,
) -> Result<(), TestCaseError> {
    let n = pes.len();
    let (mut sim, remove) = case_job(&pes, &picks, newcomers, admit, tree, seed)?;
    let before = uids(n);
    match fault {
        Fault::None => {}
        Fault::Kill { victim, at } => {
            let whens: [fn(&Action) -> bool; 6] = [
                |a| matches!(a, Action::Draining(true)),
                |a| matches!(a, Action::HandOver { .. }),
                |a| matches!(a, Action::TakeLate),
                |a| matches!(a, Action::Commit { .. }),
                |a| matches!(a, Action::Install { .. }),
                |a| {
                    matches!(
                        a,
                        Action::Send {
                            frame: ControlFrame::Ready,
                            ..
                        }
                    )
                },
            ];
            sim.faults.kill = Some((before[victim % n], whens[at as usize]));
        }
        Fault::Silent { victim } => {
            fn all(_: &ControlFrame) -> bool {
                true
            }
            sim.faults.silent = Some((before[victim % n], all));
        }
        Fault::Refuse => sim.faults.refuse_commit = true,
        Fault::LoseCommit { made: false } => sim.faults.lose_commits = 1,
        Fault::LoseCommit { made: true } => sim.faults.lose_after_made = true,
    }
    sim.traffic(traffic);
    sim.rescale(remove.clone(), admit);
    sim.run();
    let removed: Vec<u64> = remove.iter().map(|&i| 100 + u64::from(i)).collect();
    let succeeded = sim.view.epoch == 8
        && before
            .iter()
            .filter(|u| !removed.contains(u))
            .all(|u| matches!(sim.outcome_of(*u), Some(Outcome::Resumed { .. })));
    if succeeded {
        assert_rescaled(&sim, &before, &removed, 8);
    } else {
        // A connection lost under the commit is recovered from.
        let trouble = !matches!(fault, Fault::None | Fault::LoseCommit { .. });
        prop_assert!(
            trouble,
            "a rescale without a fault failed: {:?}",
            sim.nodes
                .values()
                .map(|n| n.outcomes.clone())
                .collect::<Vec<_>>()
        );
        // Everyone who took part and was not removed ended failed or
        // aborted; whoever resumed heard of the loss later and aborted.
        let survivors: Vec<u64> = before
            .iter()
            .copied()
            .filter(|u| !removed.contains(u))
            .collect();
        for uid in &survivors {
            let node = &sim.nodes[uid];
            prop_assert!(
                !node.driver.busy() || !node.alive,
                "uid {} still waits",
                uid
            );
            match node.outcomes.last() {
                Some(Outcome::Failed(f)) => {
                    prop_assert!(f.to_string().starts_with(&f.step.to_string()))
                }
                Some(Outcome::Lost { .. }) => {}
                _ if !node.alive => {}
                None => prop_assert!(false, "uid {} ended without a word", uid),
                Some(other) => prop_assert!(
                    false,
                    "uid {} ended {:?} while the rescale failed",
                    uid,
                    other
                ),
            }
        }
        // Nobody installed an epoch the others did not.
        let epochs: BTreeSet<u64> = sim
            .nodes
            .values()
            .filter_map(|n| {
                n.outcomes.iter().find_map(|o| match o {
                    Outcome::Resumed { epoch, .. } | Outcome::Joined { epoch, .. } => Some(*epoch),
                    _ => None,
                })
            })
            .collect();
        prop_assert!(epochs.len() <= 1, "{:?}", epochs);
    }
    Ok(())
}

/// 96 cases of a fixed seed: the same cases on every run, so CI is
/// reproducible. `PROPTEST_RNG_SEED=random` (or another number) and
/// `PROPTEST_CASES` explore further; set, they win over these.
fn interleaving_config() -> ProptestConfig {
    // The default reads the PROPTEST_* variables.
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 96;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x5eed_d417);
    }
    config
}

proptest! {
    #![proptest_config(interleaving_config())]

    /// See [`interleaving_case`].
    #[test]
    fn random_interleavings_end_the_same_everywhere(
        pes in proptest::collection::vec(1u32..4, 1..8),
        picks in proptest::collection::vec(any::<bool>(), 8),
        newcomers in 0usize..3,
        admit in 0u32..3,
        traffic in 0u64..4,
        tree in any::<bool>(),
        fault in fault(),
        seed in any::<u64>(),
    ) {
        interleaving_case(pes, picks, newcomers, admit, traffic, tree, fault, seed)?;
    }
}

/// One case of the recovery property: a rescale of a job with recovery on,
/// events interleaved at random, a member other than node 0 killed when a
/// node first reaches a point of the rescale (before the commit, or after
/// it: node 0's View to the survivors, its install, the first Ready of the
/// barrier), control frames to the dead node lost on the way or failing at
/// once (`fail_sends`). Every node that
/// stays ends the same way: in epoch 8, the rescale made (the victim was
/// one it removes, or it lost nothing) or abandoned for a recovery
/// without the victim, which admits every newcomer waiting; or in epoch
/// 9, the rescale made and then recovered from in the view it made.
/// Nobody is left waiting.
#[allow(clippy::too_many_arguments)]
fn recovery_case(
    pes: Vec<u32>,
    picks: Vec<bool>,
    newcomers: usize,
    admit: u32,
    traffic: u64,
    tree: bool,
    victim: usize,
    at: usize,
    fail_sends: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let n = pes.len();
    let (sim, remove) = case_job(&pes, &picks, newcomers, admit, tree, seed)?;
    let mut sim = sim.recovering();
    sim.faults.sends_to_dead_fail = fail_sends;
    let before = uids(n);
    let victim = before[1 + victim % (n - 1)];
    let whens: [fn(&Action) -> bool; 8] = [
        |a| matches!(a, Action::Draining(true)),
        |a| matches!(a, Action::HandOver { .. }),
        |a| matches!(a, Action::TakeLate),
        |a| matches!(a, Action::QueryPending { .. }),
        |a| matches!(a, Action::Commit { .. }),
        |a| {
            matches!(
                a,
                Action::Send {
                    frame: ControlFrame::View(_),
                    ..
                }
            )
        },
        |a| matches!(a, Action::Install { .. }),
        |a| {
            matches!(
                a,
                Action::Send {
                    frame: ControlFrame::Ready,
                    ..
                }
            )
        },
    ];
    sim.faults.kill = Some((victim, whens[at % whens.len()]));
    sim.traffic(traffic);
    sim.rescale(remove.clone(), admit);
    sim.run();
    let removed: Vec<u64> = remove.iter().map(|&i| 100 + u64::from(i)).collect();
    let admitted = (admit as usize).min(newcomers) as u64;
    let rescaled: Vec<u64> = before
        .iter()
        .copied()
        .filter(|u| !removed.contains(u))
        .chain(1000..1000 + admitted)
        .collect();
    let rolled_back = matches!(sim.outcome_of(100), Some(Outcome::RolledBack { .. }));
    let epoch = sim.view.epoch;
    let want: Vec<u64> = match (epoch, rolled_back) {
        // Abandoned before its commit: recovered in the view left, every
        // newcomer admitted.
        (8, true) => before
            .iter()
            .copied()
            .filter(|&u| u != victim)
            .chain(1000..1000 + newcomers as u64)
            .collect(),
        // Made: only when it removes the victim (or nobody was killed).
        (8, false) => {
            prop_assert!(
                !sim.killed || removed.contains(&victim),
                "made without the victim: {:?}",
                sim.nodes
                    .values()
                    .map(|n| (n.uid, n.outcomes.clone(), n.driver.state_name()))
                    .collect::<Vec<_>>()
            );
            rescaled.clone()
        }
        // Made, then recovered in the view it made (the loss came after
        // the commit), the newcomers still waiting admitted.
        (9, true) => rescaled
            .iter()
            .copied()
            .filter(|&u| u != victim)
            .chain(1000 + admitted..1000 + newcomers as u64)
            .collect(),
        _ => {
            prop_assert!(false, "epoch {} (rolled back: {})", epoch, rolled_back);
            unreachable!()
        }
    };
    prop_assert_eq!(sim.members(), want.clone());
    for uid in &want {
        let node = &sim.nodes[uid];
        prop_assert!(!node.driver.busy(), "uid {} still waits", uid);
        let o = node.outcomes.last();
        let ok = match o {
            Some(Outcome::RolledBack { epoch: e, members }) => {
                rolled_back && *e == epoch && *members == want
            }
            Some(Outcome::Resumed { epoch: e, members }) => {
                !rolled_back && *e == epoch && *members == want
            }
            Some(Outcome::Joined { epoch: e, members }) => *e == epoch && *members == want,
            _ => false,
        };
        prop_assert!(
            ok,
            "uid {} ended {:?} (rolled back: {})",
            uid,
            node.outcomes,
            rolled_back
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(interleaving_config())]

    /// See [`recovery_case`].
    #[test]
    fn a_loss_in_a_rescale_with_recovery_on_ends_the_same_everywhere(
        pes in proptest::collection::vec(1u32..4, 2..8),
        picks in proptest::collection::vec(any::<bool>(), 8),
        newcomers in 0usize..3,
        admit in 0u32..3,
        traffic in 0u64..4,
        tree in any::<bool>(),
        victim in 0usize..8,
        at in 0usize..8,
        fail_sends in any::<bool>(),
        seed in any::<u64>(),
    ) {
        recovery_case(pes, picks, newcomers, admit, traffic, tree, victim, at, fail_sends, seed)?;
    }
}

/// Found by the property above with a random seed, when leaving nodes could
/// be inner vertices of the drain tree: a leaving node whose drain parent
/// was also leaving, and was killed after the root's second drain round
/// (here: as the first survivor installs the new view), never got its
/// totals; the job went on at the new epoch but that node failed at
/// `DrainTotals` instead of departing. Leaving nodes are now leaves of the
/// drain tree (`driver/drain.rs`), so nothing waits on one once it sent its
/// counts up.
#[test]
fn a_leaving_child_of_a_killed_leaving_drain_parent_departs() {
    interleaving_case(
        vec![1, 2, 1, 2, 1, 2],
        vec![false, true, false, false, false, true, false, false],
        0,
        0,
        0,
        true,
        Fault::Kill { victim: 7, at: 4 },
        778471630448258144,
    )
    .unwrap();
}
