//! The simulated cloud: instances, their lifecycle and bill, and the fault
//! injector that plays the provider (recommendations, notices with a
//! deadline, terminations, boot delays, periods without spot capacity).
//!
//! Sans-IO and in virtual time: the driver tells it what it asked for
//! ([`Cloud::request_spot`], [`Cloud::release`]) and calls
//! [`Cloud::advance`] with the simulated time; it answers with
//! [`CloudEvent`]s and says when it next has something to do
//! ([`Cloud::next_event`]). A seeded random trace is generated up front, so
//! the same scenario and seed give the same arrivals; the victims of each
//! arrival are chosen among the spot instances running at that moment.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::scenario::{Action, Scenario, Scripted};
use crate::policy::{Capacity, Time};

/// What the cloud did, for the driver to act on.
#[derive(Clone, Debug, PartialEq)]
pub enum CloudEvent {
    /// A requested instance finished booting: start its node now.
    Booted {
        /// The instance.
        instance: String,
    },
    /// A rebalance recommendation for a running instance.
    Recommendation {
        /// The instance.
        instance: String,
    },
    /// An interruption notice: the instance is terminated at `deadline`.
    Notice {
        /// The instance.
        instance: String,
        /// When it is terminated (simulated time).
        deadline: Time,
    },
    /// The instance is terminated now: kill whatever still runs on it.
    Terminated {
        /// The instance.
        instance: String,
        /// It had a notice (false: an unannounced termination).
        announced: bool,
    },
    /// Spot launches wait until `until`.
    NoSpotCapacity {
        /// End of the shortage.
        until: Time,
    },
    /// A scripted event could not apply (its instance is not running).
    Skipped {
        /// Line in the scenario file.
        line: usize,
        /// Why.
        why: String,
    },
}

/// A scripted event that never happened: the job ended before its time.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unreached {
    /// Its line in the scenario file.
    pub line: usize,
    /// When it was due, simulated seconds.
    pub at: f64,
    /// What it would have done.
    pub event: String,
}

/// Where an instance is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum InstanceState {
    /// Requested while there was no spot capacity: waits for it.
    WaitingForCapacity,
    /// Booting until the given time.
    Booting,
    /// Running a node.
    Running,
    /// Released by the job (vacated or cancelled).
    Released,
    /// Terminated by the cloud.
    Terminated,
}

/// One instance and its bill.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// Its name (the member or newcomer it runs).
    pub name: String,
    /// Its type.
    pub instance_type: String,
    /// PEs its node runs (its type's).
    pub pes: u32,
    /// On-demand or spot.
    #[serde(serialize_with = "capacity_name")]
    pub capacity: Capacity,
    /// Where it is.
    pub state: InstanceState,
    /// Requested at (billed from then).
    #[serde(serialize_with = "secs")]
    pub requested_at: Time,
    /// Booting until.
    #[serde(skip)]
    ready_at: Option<Time>,
    /// Noticed: terminated at.
    #[serde(serialize_with = "opt_secs")]
    pub deadline: Option<Time>,
    /// Released or terminated at (billed until then).
    #[serde(serialize_with = "opt_secs")]
    pub ended_at: Option<Time>,
    /// Hourly price of its capacity.
    pub price_per_hour: f64,
    /// Hourly on-demand price of its type (for the comparison).
    pub on_demand_price_per_hour: f64,
}

fn capacity_name<S: serde::Serializer>(c: &Capacity, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match c {
        Capacity::OnDemand => "onDemand",
        Capacity::Spot => "spot",
    })
}

fn secs<S: serde::Serializer>(t: &Time, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(t.as_secs_f64())
}

fn opt_secs<S: serde::Serializer>(t: &Option<Time>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_some(&t.as_secs_f64()),
        None => s.serialize_none(),
    }
}

impl Instance {
    /// Seconds it was billed for, up to `now` if it still runs.
    pub fn billed(&self, now: Time) -> Duration {
        self.ended_at.unwrap_or(now).saturating_sub(self.requested_at)
    }

    /// Its bill up to `now`, and the bill of the same time on demand.
    pub fn cost(&self, now: Time) -> (f64, f64) {
        let hours = self.billed(now).as_secs_f64() / 3600.0;
        (hours * self.price_per_hour, hours * self.on_demand_price_per_hour)
    }

    fn alive(&self) -> bool {
        !matches!(self.state, InstanceState::Released | InstanceState::Terminated)
    }
}

/// An arrival of the random trace: at `at`, `batch` victims; the u64s pick them.
#[derive(Clone, Debug, PartialEq)]
struct Arrival {
    at: Time,
    picks: Vec<u64>,
    notice_at: Time,
    deadline: Duration,
}

#[derive(Clone, Debug, PartialEq)]
enum Pending {
    Scripted(Scripted),
    /// A random arrival's recommendation (victims chosen now, noticed later).
    RandomRecommend(Arrival),
    /// A random arrival's notice for chosen victims (or to be chosen).
    RandomNotice { arrival: Arrival, victims: Option<Vec<String>> },
    /// A random unannounced termination: at `at`, of the running spot
    /// instance `pick` chooses then.
    RandomTerminate { at: Time, pick: u64 },
}

impl Pending {
    fn at(&self) -> Time {
        match self {
            Pending::Scripted(s) => s.at,
            Pending::RandomRecommend(a) => a.at,
            Pending::RandomNotice { arrival, .. } => arrival.notice_at,
            Pending::RandomTerminate { at, .. } => *at,
        }
    }
}

/// The simulated cloud of one job.
#[derive(Clone, Debug)]
pub struct Cloud {
    scenario: Scenario,
    instances: BTreeMap<String, Instance>,
    pending: VecDeque<Pending>,
    no_capacity_until: Option<Time>,
    out: Vec<CloudEvent>,
}

impl Cloud {
    /// A cloud running the launch instances (name, capacity, type) from time 0.
    pub fn new(scenario: Scenario, scripted: Vec<Scripted>, launch: &[(String, Capacity, String)]) -> Self {
        let mut pending: Vec<Pending> = scripted.into_iter().map(Pending::Scripted).collect();
        if let Some(trace) = &scenario.random {
            let spot = launch.iter().filter(|(_, c, _)| *c == Capacity::Spot).count();
            pending.extend(random_arrivals(trace, spot).into_iter().map(|a| {
                if a.at < a.notice_at {
                    Pending::RandomRecommend(a)
                } else {
                    Pending::RandomNotice { arrival: a, victims: None }
                }
            }));
            pending.extend(
                random_terminations(trace, spot)
                    .into_iter()
                    .map(|(at, pick)| Pending::RandomTerminate { at, pick }),
            );
        }
        pending.sort_by_key(Pending::at);
        let mut cloud = Cloud {
            scenario,
            instances: BTreeMap::new(),
            pending: pending.into(),
            no_capacity_until: None,
            out: Vec::new(),
        };
        for (name, capacity, itype) in launch {
            cloud.add(name, *capacity, itype, Time::ZERO, InstanceState::Running, None);
        }
        cloud
    }

    fn add(&mut self, name: &str, capacity: Capacity, itype: &str, now: Time, state: InstanceState, ready_at: Option<Time>) {
        let t = self
            .scenario
            .instance_type(itype)
            .expect("instance types are validated by Scenario::load");
        let price = match capacity {
            Capacity::OnDemand => t.price.on_demand,
            Capacity::Spot => t.price.spot,
        };
        self.instances.insert(
            name.to_owned(),
            Instance {
                name: name.to_owned(),
                instance_type: itype.to_owned(),
                pes: t.pes,
                capacity,
                state,
                requested_at: now,
                ready_at,
                deadline: None,
                ended_at: None,
                price_per_hour: price,
                on_demand_price_per_hour: t.price.on_demand,
            },
        );
    }

    /// Every instance ever requested, by name.
    pub fn instances(&self) -> impl Iterator<Item = &Instance> {
        self.instances.values()
    }

    /// The instance named `name`.
    pub fn instance(&self, name: &str) -> Option<&Instance> {
        self.instances.get(name)
    }

    /// The type a replacement for `for_member` (or a plain newcomer) runs on.
    pub fn replacement_type(&self, for_member: Option<&str>) -> String {
        let fleet = &self.scenario.fleet;
        let from_member = for_member
            .and_then(|m| self.instances.get(m))
            .filter(|i| i.capacity == Capacity::Spot)
            .map(|i| fleet.replace_with.get(&i.instance_type).unwrap_or(&i.instance_type).clone());
        from_member
            .or_else(|| fleet.replacement.clone())
            .or_else(|| fleet.spot.first().cloned())
            .unwrap_or_else(|| fleet.on_demand.clone())
    }

    /// The job asks for a spot instance named `name` at `now`: it boots after
    /// the scenario's boot time, or after the current capacity shortage.
    pub fn request_spot(&mut self, now: Time, name: &str, itype: &str) {
        if self.instances.contains_key(name) {
            return;
        }
        let boot = Duration::from_secs_f64(self.scenario.fleet.boot_seconds);
        match self.no_capacity_until.filter(|until| *until > now) {
            Some(_) => self.add(name, Capacity::Spot, itype, now, InstanceState::WaitingForCapacity, None),
            None => self.add(name, Capacity::Spot, itype, now, InstanceState::Booting, Some(now + boot)),
        }
    }

    /// The job gave the instance back (vacated or cancelled): billing stops.
    pub fn release(&mut self, now: Time, name: &str) {
        if let Some(i) = self.instances.get_mut(name).filter(|i| i.alive()) {
            i.state = InstanceState::Released;
            i.ended_at = Some(now);
        }
    }

    /// The next time at which [`advance`](Cloud::advance) has something to do.
    pub fn next_event(&self) -> Option<Time> {
        let mut times: Vec<Time> = self.pending.front().map(Pending::at).into_iter().collect();
        for i in self.instances.values() {
            match i.state {
                InstanceState::Booting => times.extend(i.ready_at),
                InstanceState::Running => times.extend(i.deadline),
                InstanceState::WaitingForCapacity => times.extend(self.no_capacity_until),
                _ => {}
            }
        }
        times.into_iter().min()
    }

    /// The scripted events still waiting for their time, in time order:
    /// asked when the job has ended, the ones it never saw.
    pub fn unreached_scripted(&self) -> Vec<Unreached> {
        self.pending
            .iter()
            .filter_map(|p| match p {
                Pending::Scripted(s) => Some(Unreached {
                    line: s.line,
                    at: s.at.as_secs_f64(),
                    event: s.action.to_string(),
                }),
                _ => None,
            })
            .collect()
    }

    /// Everything that happens up to `now`, in time order.
    pub fn advance(&mut self, now: Time) -> Vec<CloudEvent> {
        loop {
            let due = self.next_event().filter(|t| *t <= now);
            let Some(t) = due else { break };
            self.step(t);
        }
        std::mem::take(&mut self.out)
    }

    /// Does what is due at `t` (the earliest thing due).
    fn step(&mut self, t: Time) {
        // Capacity back: the waiting launches start booting.
        if self.no_capacity_until.is_some_and(|u| u <= t) {
            self.no_capacity_until = None;
            let boot = Duration::from_secs_f64(self.scenario.fleet.boot_seconds);
            for i in self.instances.values_mut() {
                if i.state == InstanceState::WaitingForCapacity {
                    i.state = InstanceState::Booting;
                    i.ready_at = Some(t + boot);
                }
            }
        }
        let names: Vec<String> = self.instances.keys().cloned().collect();
        for name in names {
            let i = self.instances.get_mut(&name).expect("listed");
            if i.state == InstanceState::Booting && i.ready_at.is_some_and(|r| r <= t) {
                i.state = InstanceState::Running;
                i.ready_at = None;
                self.out.push(CloudEvent::Booted { instance: name });
            } else if i.state == InstanceState::Running && i.deadline.is_some_and(|d| d <= t) {
                i.state = InstanceState::Terminated;
                i.ended_at = i.deadline;
                self.out.push(CloudEvent::Terminated {
                    instance: name,
                    announced: true,
                });
            }
        }
        while self.pending.front().is_some_and(|p| p.at() <= t) {
            let p = self.pending.pop_front().expect("front exists");
            self.apply(t, p);
        }
    }

    fn running_spot(&self, name: &str) -> bool {
        self.instances
            .get(name)
            .is_some_and(|i| i.capacity == Capacity::Spot && i.alive() && i.state != InstanceState::WaitingForCapacity)
    }

    fn notice(&mut self, t: Time, name: &str, deadline: Duration) {
        let Some(i) = self.instances.get_mut(name) else { return };
        if i.deadline.is_none() {
            let at = t + deadline;
            i.deadline = Some(at);
            // A booting instance is interrupted too: it never runs a node.
            if i.state != InstanceState::Running {
                i.state = InstanceState::Terminated;
                i.ended_at = Some(t);
                self.out.push(CloudEvent::Terminated {
                    instance: name.to_owned(),
                    announced: true,
                });
                return;
            }
            self.out.push(CloudEvent::Notice {
                instance: name.to_owned(),
                deadline: at,
            });
        }
    }

    fn apply(&mut self, t: Time, p: Pending) {
        match p {
            Pending::Scripted(s) => {
                let skip = |why: String| CloudEvent::Skipped { line: s.line, why };
                match s.action {
                    Action::Recommend(name) if self.running_spot(&name) => {
                        self.out.push(CloudEvent::Recommendation { instance: name })
                    }
                    Action::Interrupt { instance, deadline } if self.running_spot(&instance) => {
                        self.notice(t, &instance, deadline)
                    }
                    Action::Terminate(name) if self.instances.get(&name).is_some_and(Instance::alive) => {
                        let i = self.instances.get_mut(&name).expect("checked");
                        i.state = InstanceState::Terminated;
                        i.ended_at = Some(t);
                        self.out.push(CloudEvent::Terminated {
                            instance: name,
                            announced: false,
                        });
                    }
                    Action::NoSpotCapacity(d) => {
                        let until = t + d;
                        self.no_capacity_until = Some(self.no_capacity_until.map_or(until, |u| u.max(until)));
                        for i in self.instances.values_mut() {
                            if i.state == InstanceState::Booting && i.capacity == Capacity::Spot {
                                i.state = InstanceState::WaitingForCapacity;
                                i.ready_at = None;
                            }
                        }
                        self.out.push(CloudEvent::NoSpotCapacity { until });
                    }
                    Action::Recommend(name) | Action::Interrupt { instance: name, .. } => {
                        self.out.push(skip(format!("{name} is not a running spot instance at {:.0} s", t.as_secs_f64())))
                    }
                    Action::Terminate(name) => {
                        self.out.push(skip(format!("{name} is not running at {:.0} s", t.as_secs_f64())))
                    }
                }
            }
            Pending::RandomRecommend(arrival) => {
                let victims = self.pick(&arrival.picks);
                for v in &victims {
                    self.out.push(CloudEvent::Recommendation { instance: v.clone() });
                }
                let p = Pending::RandomNotice {
                    arrival,
                    victims: Some(victims),
                };
                let pos = self.pending.iter().position(|q| q.at() > p.at()).unwrap_or(self.pending.len());
                self.pending.insert(pos, p);
            }
            Pending::RandomNotice { arrival, victims } => {
                let victims = victims.unwrap_or_else(|| self.pick(&arrival.picks));
                for v in victims {
                    if self.running_spot(&v) {
                        self.notice(t, &v, arrival.deadline);
                    }
                }
            }
            Pending::RandomTerminate { pick, .. } => {
                // Any running spot instance, noticed or not: no notice
                // protects from a hardware failure.
                let candidates: Vec<String> = self
                    .instances
                    .values()
                    .filter(|i| i.capacity == Capacity::Spot && i.state == InstanceState::Running)
                    .map(|i| i.name.clone())
                    .collect();
                if !candidates.is_empty() {
                    let name = candidates[(pick % candidates.len() as u64) as usize].clone();
                    let i = self.instances.get_mut(&name).expect("a candidate");
                    i.state = InstanceState::Terminated;
                    i.ended_at = Some(t);
                    self.out.push(CloudEvent::Terminated {
                        instance: name,
                        announced: false,
                    });
                }
            }
        }
    }

    /// Chooses distinct running spot instances without a notice.
    fn pick(&self, picks: &[u64]) -> Vec<String> {
        let mut candidates: Vec<String> = self
            .instances
            .values()
            .filter(|i| i.capacity == Capacity::Spot && i.state == InstanceState::Running && i.deadline.is_none())
            .map(|i| i.name.clone())
            .collect();
        let mut out = Vec::new();
        for p in picks {
            if candidates.is_empty() {
                break;
            }
            let k = (*p % candidates.len() as u64) as usize;
            out.push(candidates.remove(k));
        }
        out
    }
}

/// Poisson arrivals at `rate` per spot instance-hour over the launch spot
/// count, each with its victims' picks, up to `until`.
fn random_arrivals(trace: &super::scenario::RandomTrace, spot: usize) -> Vec<Arrival> {
    let mut rng = StdRng::seed_from_u64(trace.seed);
    let per_second = trace.notices_per_instance_hour * spot as f64 / 3600.0 / f64::from(trace.batch);
    let mut out = Vec::new();
    if per_second <= 0.0 {
        return out;
    }
    let mut t = 0.0;
    loop {
        let u: f64 = rng.gen_range(f64::EPSILON..1.0);
        t += -u.ln() / per_second;
        if t > trace.until {
            break;
        }
        let picks = (0..trace.batch).map(|_| rng.gen()).collect();
        let at = Duration::from_secs_f64(t);
        out.push(Arrival {
            at,
            picks,
            notice_at: at + Duration::from_secs_f64(trace.recommendation_lead),
            deadline: Duration::from_secs_f64(trace.deadline),
        });
    }
    out
}

/// Poisson arrivals of unannounced terminations at their rate per spot
/// instance-hour over the launch spot count, up to `until`, each with the
/// pick of its victim. Drawn from a stream of their own, so the notices of
/// a seed stay what they were with or without terminations.
fn random_terminations(trace: &super::scenario::RandomTrace, spot: usize) -> Vec<(Time, u64)> {
    let mut rng = StdRng::seed_from_u64(trace.seed ^ TERMINATION_STREAM);
    let per_second = trace.terminations_per_instance_hour * spot as f64 / 3600.0;
    let mut out = Vec::new();
    if per_second <= 0.0 {
        return out;
    }
    let mut t = 0.0;
    loop {
        let u: f64 = rng.gen_range(f64::EPSILON..1.0);
        t += -u.ln() / per_second;
        if t > trace.until {
            break;
        }
        out.push((Duration::from_secs_f64(t), rng.gen()));
    }
    out
}

/// Mixed into the seed of the terminations' stream.
const TERMINATION_STREAM: u64 = 0x7465_726d_696e_6174;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::scenario::{JobShape, Scenario};

    const SCENARIO: &str = "\
timeFactor: 1
instanceTypes:
  - { name: big, pes: 1, speed: 1.0, price: { onDemand: 3.6, spot: 1.8 } }
  - { name: small, pes: 1, speed: 0.5, price: { onDemand: 1.8, spot: 0.9 } }
fleet: { onDemand: big, spot: [big, small], bootSeconds: 20 }
events:
  - { at: 10, rebalanceRecommendation: j-1 }
  - { at: 30, interruption: j-2, deadline: 60 }
  - { at: 40, noSpotCapacity: 50 }
  - { at: 45, terminate: j-7 }
";

    fn shape() -> JobShape {
        JobShape {
            launch_members: vec!["j-0".into(), "j-1".into(), "j-2".into()],
            on_demand: 1,
            newcomer_prefix: "j-n".into(),
        }
    }

    fn launch() -> Vec<(String, Capacity, String)> {
        vec![
            ("j-0".into(), Capacity::OnDemand, "big".into()),
            ("j-1".into(), Capacity::Spot, "big".into()),
            ("j-2".into(), Capacity::Spot, "small".into()),
        ]
    }

    fn cloud(text: &str) -> Cloud {
        let mut shape = shape();
        shape.launch_members.push("j-7".into());
        let (s, ev) = Scenario::load("t.yaml", text, &shape).expect("valid");
        Cloud::new(s, ev, &launch())
    }

    fn at(s: u64) -> Time {
        Duration::from_secs(s)
    }

    #[test]
    fn scripted_events_arrive_at_their_time_and_a_notice_terminates_at_its_deadline() {
        let mut c = cloud(SCENARIO);
        assert_eq!(c.next_event(), Some(at(10)));
        assert_eq!(c.advance(at(9)), vec![]);
        assert_eq!(c.advance(at(10)), vec![CloudEvent::Recommendation { instance: "j-1".into() }]);
        assert_eq!(
            c.advance(at(30)),
            vec![CloudEvent::Notice { instance: "j-2".into(), deadline: at(90) }]
        );
        // The replacement asked for before the shortage boots after 20 s...
        c.request_spot(at(35), "j-n0", "big");
        // ...but the shortage at 40 s holds it until 90 s, then it boots.
        let ev = c.advance(at(45));
        assert_eq!(ev[0], CloudEvent::NoSpotCapacity { until: at(90) });
        assert!(matches!(&ev[1], CloudEvent::Skipped { line: 10, .. }), "{ev:?}");
        assert_eq!(c.instance("j-n0").unwrap().state, InstanceState::WaitingForCapacity);
        assert_eq!(c.next_event(), Some(at(90)));
        assert_eq!(
            c.advance(at(90)),
            vec![CloudEvent::Terminated { instance: "j-2".into(), announced: true }]
        );
        assert_eq!(c.instance("j-n0").unwrap().state, InstanceState::Booting);
        assert_eq!(c.advance(at(110)), vec![CloudEvent::Booted { instance: "j-n0".into() }]);
        assert_eq!(c.next_event(), None);
    }

    #[test]
    fn events_after_the_end_are_listed_as_never_happened() {
        let mut c = cloud(SCENARIO);
        assert_eq!(c.unreached_scripted().len(), 4, "nothing has happened yet");
        c.advance(at(35));
        // The job ends at 35 s: the shortage at 40 s and the termination at
        // 45 s never came; the random trace's arrivals are not listed.
        let left = c.unreached_scripted();
        assert_eq!(
            left,
            vec![
                Unreached { line: 9, at: 40.0, event: "no spot capacity for 50 s".into() },
                Unreached { line: 10, at: 45.0, event: "termination of j-7".into() },
            ]
        );
        c.advance(at(45));
        assert_eq!(c.unreached_scripted(), vec![], "a skipped event did happen: it was tried");
        let random = format!("{SCENARIO}random: {{ seed: 1, noticesPerInstanceHour: 3600, until: 600 }}\n");
        let c = cloud(&random);
        assert_eq!(c.unreached_scripted().len(), 4, "only the scripted events, not the trace");
    }

    #[test]
    fn bills_follow_each_instance_from_request_to_release_or_termination() {
        let mut c = cloud(SCENARIO);
        c.advance(at(100));
        c.release(at(50), "j-1");
        // j-1 (big spot, 1.8/h) ran 50 s; j-2 (small spot) until its deadline at 90 s.
        let cost = |n: &str| c.instance(n).unwrap().cost(at(3600));
        assert!((cost("j-1").0 - 1.8 * 50.0 / 3600.0).abs() < 1e-9);
        assert!((cost("j-1").1 - 3.6 * 50.0 / 3600.0).abs() < 1e-9);
        assert!((cost("j-2").0 - 0.9 * 90.0 / 3600.0).abs() < 1e-9);
        assert!((cost("j-0").0 - 3.6).abs() < 1e-9, "on demand, still running");
    }

    #[test]
    fn a_replacement_takes_its_members_type_or_the_one_replace_with_names() {
        let c = cloud(SCENARIO);
        assert_eq!(c.replacement_type(Some("j-2")), "small");
        assert_eq!(c.replacement_type(Some("j-0")), "big", "on demand: the first spot type");
        assert_eq!(c.instance("j-2").unwrap().pes, 1);
        let mixed = SCENARIO
            .replace("name: small, pes: 1", "name: small, pes: 2")
            .replace("bootSeconds: 20 }", "bootSeconds: 20, replaceWith: { big: small } }");
        let c = cloud(&mixed);
        assert_eq!(c.replacement_type(Some("j-1")), "small", "big is replaced by small");
        assert_eq!(c.replacement_type(Some("j-2")), "small");
        assert_eq!(c.instance("j-2").unwrap().pes, 2);
        assert_eq!(c.replacement_type(None), "big", "a plain newcomer: the first spot type");
    }

    #[test]
    fn an_unannounced_termination_and_a_notice_for_a_booting_instance() {
        let text = "\
instanceTypes: [{ name: big, pes: 1, speed: 1.0, price: { onDemand: 1, spot: 1 } }]
fleet: { onDemand: big, spot: [big], bootSeconds: 20 }
events:
  - { at: 5, interruption: j-n0, deadline: 120 }
  - { at: 8, terminate: j-1 }
";
        let (s, ev) = Scenario::load("t.yaml", text, &shape()).expect("valid");
        let mut c = Cloud::new(s, ev, &launch()[..2]);
        c.request_spot(at(1), "j-n0", "big");
        assert_eq!(
            c.advance(at(10)),
            vec![
                CloudEvent::Terminated { instance: "j-n0".into(), announced: true },
                CloudEvent::Terminated { instance: "j-1".into(), announced: false },
            ]
        );
        assert_eq!(c.advance(at(1000)), vec![], "nothing boots or ends twice");
    }

    fn random(seed: u64) -> Cloud {
        random_with(seed, "")
    }

    /// [`random`] with `extra` fields in its trace (`, key: value`).
    fn random_with(seed: u64, extra: &str) -> Cloud {
        let text = format!(
            "\
instanceTypes: [{{ name: big, pes: 1, speed: 1.0, price: {{ onDemand: 1, spot: 1 }} }}]
fleet: {{ onDemand: big, spot: [big] }}
random: {{ seed: {seed}, noticesPerInstanceHour: 60, batch: 2, recommendationLead: 10, deadline: 30, until: 600{extra} }}
"
        );
        let mut shape = shape();
        let mut launch = vec![("j-0".to_string(), Capacity::OnDemand, "big".to_string())];
        shape.launch_members.truncate(1);
        for k in 1..=8 {
            shape.launch_members.push(format!("j-{k}"));
            launch.push((format!("j-{k}"), Capacity::Spot, "big".into()));
        }
        let (s, ev) = Scenario::load("t.yaml", &text, &shape).expect("valid");
        Cloud::new(s, ev, &launch)
    }

    fn trace(mut c: Cloud) -> Vec<(Time, CloudEvent)> {
        let mut out = Vec::new();
        while let Some(t) = c.next_event() {
            for e in c.advance(t) {
                // The job replaces nothing here: terminated instances stay gone.
                out.push((t, e));
            }
        }
        out
    }

    #[test]
    fn a_seeded_random_trace_is_reproducible_and_seeds_differ() {
        let a = trace(random(7));
        assert_eq!(a, trace(random(7)));
        assert_ne!(a, trace(random(8)));
        let notices: Vec<_> = a.iter().filter(|(_, e)| matches!(e, CloudEvent::Notice { .. })).collect();
        assert!(!notices.is_empty(), "60 per instance-hour over 8 instances and 10 minutes");
        // Every notice had its recommendation 10 s before, and terminates 30 s after.
        for (t, e) in &notices {
            let CloudEvent::Notice { instance, deadline } = e else { unreachable!() };
            assert_eq!(*deadline, *t + at(30));
            assert!(a.iter().any(|(r, e)| *r + at(10) == *t
                && *e == CloudEvent::Recommendation { instance: instance.clone() }));
            assert!(a.iter().any(|(r, e)| r == deadline
                && *e == CloudEvent::Terminated { instance: instance.clone(), announced: true }));
        }
        // Never more victims than spot instances, never one twice.
        let mut noticed: Vec<_> = notices.iter().map(|(_, e)| format!("{e:?}")).collect();
        noticed.sort();
        noticed.dedup();
        assert_eq!(noticed.len(), notices.len());
        assert!(notices.len() <= 8);
    }

    /// Unannounced terminations of a seeded trace: reproducible, of
    /// running spot instances only (node 0's on-demand one never), and
    /// the notices of the seed are what they were until the first of them.
    #[test]
    fn random_unannounced_terminations_hit_spot_instances_and_leave_the_notices_of_the_seed_alone() {
        use std::collections::BTreeSet;
        const EXTRA: &str = ", terminationsPerInstanceHour: 20";
        let with = trace(random_with(7, EXTRA));
        assert_eq!(with, trace(random_with(7, EXTRA)), "reproducible");
        let killed: Vec<&(Time, CloudEvent)> = with
            .iter()
            .filter(|(_, e)| matches!(e, CloudEvent::Terminated { announced: false, .. }))
            .collect();
        assert!(!killed.is_empty(), "20 per instance-hour over 8 instances and 10 minutes");
        let mut names = BTreeSet::new();
        for (_, e) in &killed {
            let CloudEvent::Terminated { instance, .. } = e else { unreachable!() };
            assert_ne!(instance, "j-0", "never the on-demand instance");
            assert!(names.insert(instance.clone()), "{instance} terminated twice");
        }
        let first = killed[0].0;
        let before = |t: &Vec<(Time, CloudEvent)>| t.iter().filter(|(at, _)| *at < first).cloned().collect::<Vec<_>>();
        assert_eq!(before(&with), before(&trace(random(7))));
        // Without the field, no unannounced termination.
        assert!(!trace(random(7)).iter().any(|(_, e)| matches!(e, CloudEvent::Terminated { announced: false, .. })));
    }
}
