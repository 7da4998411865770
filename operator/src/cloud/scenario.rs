//! Scenario files: the cloud a job runs on, and what that cloud does to it.
//!
//! A scenario names instance types (PEs, relative speed, hourly prices), says
//! which types the job's on-demand and spot parts run on, and lists what the
//! cloud does and when: rebalance recommendations, interruption notices with
//! their deadline, unannounced terminations, periods without spot capacity;
//! or a seeded random trace of notices. Times are simulated seconds since the
//! job started; `timeFactor` simulated seconds pass per real second.
//!
//! Validation names the line of the entry at fault (serde_yaml reports the
//! line of a syntax or type error; for a semantic error, such as an unknown
//! instance type or a notice for a member that never exists, the line is
//! found from the entry's position in its list).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The default deadline of an interruption notice: two minutes, as on EC2.
pub const DEFAULT_NOTICE_SECONDS: f64 = 120.0;

/// An instance type of the simulated cloud.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceType {
    /// Its name, e.g. `m5.large`.
    pub name: String,
    /// PEs a node on it runs (its vCPUs, say). Types of different PE
    /// counts may share a fleet; the job's `pesPerPod` is what a relaunch
    /// (the baselines' `--mode`s) starts every node with.
    pub pes: u32,
    /// Relative speed of each of its PEs: 1.0 is `cpuPerSpeed` cores per
    /// PE (an instance's CPU quota is `speed * pes * cpuPerSpeed` cores).
    pub speed: f64,
    /// Hourly prices.
    pub price: Price,
}

/// Hourly prices of an instance type, in any currency.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Price {
    /// On-demand price per hour.
    pub on_demand: f64,
    /// Spot price per hour.
    pub spot: f64,
}

/// Which instance types the job's members run on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fleet {
    /// Type of the on-demand members (node 0 and the coordinator among them).
    pub on_demand: String,
    /// Types of the launch spot members, taken in turn.
    pub spot: Vec<String>,
    /// Type of replacements and newcomers; default: the first spot type
    /// (a replacement of a member takes that member's type, or the one
    /// [`Fleet::replace_with`] names for it).
    #[serde(default)]
    pub replacement: Option<String>,
    /// The type of a spot member's replacement, by the member's type
    /// (`{ m5.large: m5.xlarge }`: a 1-PE member is replaced by a 2-PE
    /// instance); a type it does not name is replaced by its own type.
    #[serde(default)]
    pub replace_with: BTreeMap<String, String>,
    /// Simulated seconds from asking for a spot instance to its node
    /// starting (EC2 launch and boot, pod scheduling, image pull).
    #[serde(default = "default_boot")]
    pub boot_seconds: f64,
}

fn default_boot() -> f64 {
    30.0
}

/// One thing the cloud does at a time. Exactly one kind per entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventEntry {
    /// Simulated seconds since the job started.
    pub at: f64,
    /// A rebalance recommendation for this instance (elevated risk).
    #[serde(default)]
    pub rebalance_recommendation: Option<String>,
    /// An interruption notice for this instance.
    #[serde(default)]
    pub interruption: Option<String>,
    /// Seconds from the notice to the termination (default 120).
    #[serde(default)]
    pub deadline: Option<f64>,
    /// The instance is terminated now, without notice.
    #[serde(default)]
    pub terminate: Option<String>,
    /// No spot capacity for this many seconds: launches wait.
    #[serde(default)]
    pub no_spot_capacity: Option<f64>,
}

/// A seeded random trace of interruptions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RandomTrace {
    /// Seed: the same seed gives the same trace.
    pub seed: u64,
    /// Mean interruption notices per spot instance-hour (a Poisson process).
    pub notices_per_instance_hour: f64,
    /// Instances interrupted together at each arrival.
    #[serde(default = "one")]
    pub batch: u32,
    /// A rebalance recommendation comes this many seconds before each
    /// notice (0: none).
    #[serde(default)]
    pub recommendation_lead: f64,
    /// Seconds from a notice to its termination.
    #[serde(default = "default_notice")]
    pub deadline: f64,
    /// No arrival after this time.
    pub until: f64,
    /// Mean unannounced terminations per spot instance-hour (a Poisson
    /// process of its own, independent of the notices' for a same seed):
    /// a running spot instance vanishes with no notice. Default 0.
    #[serde(default)]
    pub terminations_per_instance_hour: f64,
}

fn one() -> u32 {
    1
}

fn default_notice() -> f64 {
    DEFAULT_NOTICE_SECONDS
}

/// A scenario file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    /// Simulated seconds per real second.
    #[serde(default = "one_f")]
    pub time_factor: f64,
    /// Cores of CPU that speed 1.0 gives one PE; `None`: chosen so the
    /// launch fleet uses 90% of this machine's cores.
    #[serde(default)]
    pub cpu_per_speed: Option<f64>,
    /// The CFS period of every instance's CPU quota, ms (10 by default): a
    /// shorter one makes a throttled instance slow evenly rather than in
    /// pauses of several milliseconds. An instance whose quota would be
    /// under the kernel's 1 ms minimum gets the shortest period above this
    /// one that allows it.
    #[serde(default = "default_cpu_period_ms")]
    pub cpu_period_ms: f64,
    /// The instance types.
    pub instance_types: Vec<InstanceType>,
    /// Which types the job runs on.
    pub fleet: Fleet,
    /// Scripted events.
    #[serde(default)]
    pub events: Vec<EventEntry>,
    /// A random trace, in addition to the scripted events.
    #[serde(default)]
    pub random: Option<RandomTrace>,
    /// How the instances are networked (default: loopback).
    #[serde(default)]
    pub network: Network,
}

/// How the instances are networked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Every node on this machine's loopback (no isolation).
    #[default]
    Loopback,
    /// Each spot instance in its own network namespace, linked to a bridge
    /// by a veth pair with an address in 10.200.0.0/16 (root only).
    Namespaces,
}

fn one_f() -> f64 {
    1.0
}

fn default_cpu_period_ms() -> f64 {
    10.0
}

/// What a scripted event does.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Rebalance recommendation for an instance.
    Recommend(String),
    /// Interruption notice, terminated after the deadline.
    Interrupt {
        /// The instance.
        instance: String,
        /// From the notice to the termination.
        deadline: Duration,
    },
    /// Termination without notice.
    Terminate(String),
    /// No spot capacity for a while.
    NoSpotCapacity(Duration),
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Recommend(name) => write!(f, "rebalance recommendation for {name}"),
            Action::Interrupt { instance, deadline } => {
                write!(f, "interruption of {instance} (deadline {:.0} s)", deadline.as_secs_f64())
            }
            Action::Terminate(name) => write!(f, "termination of {name}"),
            Action::NoSpotCapacity(d) => write!(f, "no spot capacity for {:.0} s", d.as_secs_f64()),
        }
    }
}

/// A scripted event, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Scripted {
    /// When (simulated time since the start).
    pub at: Duration,
    /// What.
    pub action: Action,
    /// Its line in the file.
    pub line: usize,
}

/// A scenario that failed to load, with the line at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct ScenarioError {
    /// The file, as named to the loader.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// What the scenario is checked against: the job's member names.
#[derive(Clone, Debug)]
pub struct JobShape {
    /// Launch members' names, node 0 first.
    pub launch_members: Vec<String>,
    /// How many of them run on on-demand capacity (node 0 included).
    pub on_demand: u32,
    /// Prefix of newcomers' names (`{job}-n`): `{prefix}{k}` names the k-th
    /// newcomer the policy launches.
    pub newcomer_prefix: String,
}

/// Most PEs an instance type may run (the launcher's bound on a newcomer's
/// PE count, `spawn K pes=P`).
pub const MAX_PES: u32 = crate::local::channel::MAX_SPAWN_PES;

impl Scenario {
    /// Parses and checks a scenario file against the job it will run.
    pub fn load(file: &str, text: &str, job: &JobShape) -> Result<(Scenario, Vec<Scripted>), ScenarioError> {
        let err = |line: Option<usize>, message: String| ScenarioError {
            file: file.to_owned(),
            line,
            message,
        };
        let scenario: Scenario = serde_yaml::from_str(text).map_err(|e| {
            err(e.location().map(|l| l.line()), e.to_string())
        })?;
        let event_lines = item_lines(text, "events");
        let type_lines = item_lines(text, "instanceTypes");
        let top = |key: &str| key_line(text, key);

        if !(scenario.time_factor.is_finite() && scenario.time_factor > 0.0) {
            return Err(err(top("timeFactor"), "timeFactor must be a positive number".into()));
        }
        if let Some(c) = scenario.cpu_per_speed {
            if !(c.is_finite() && c > 0.0) {
                return Err(err(top("cpuPerSpeed"), "cpuPerSpeed must be a positive number of cores".into()));
            }
        }
        if !(1.0..=1000.0).contains(&scenario.cpu_period_ms) {
            return Err(err(
                top("cpuPeriodMs"),
                format!("cpuPeriodMs must be from 1 to 1000 (the kernel's CFS periods), not {}", scenario.cpu_period_ms),
            ));
        }
        if scenario.instance_types.is_empty() {
            return Err(err(top("instanceTypes"), "instanceTypes is empty: name at least one".into()));
        }
        let mut names = BTreeSet::new();
        for (i, t) in scenario.instance_types.iter().enumerate() {
            let line = type_lines.get(i).copied();
            if !names.insert(t.name.as_str()) {
                return Err(err(line, format!("instance type {:?} is named twice", t.name)));
            }
            if !(t.speed.is_finite() && t.speed > 0.0) {
                return Err(err(line, format!("instance type {:?}: speed must be positive", t.name)));
            }
            let prices = [t.price.on_demand, t.price.spot];
            if prices.iter().any(|p| !p.is_finite() || *p < 0.0) {
                return Err(err(line, format!("instance type {:?}: prices must not be negative", t.name)));
            }
            if !(1..=MAX_PES).contains(&t.pes) {
                return Err(err(
                    line,
                    format!("instance type {:?}: pes must be from 1 to {MAX_PES}, not {}", t.name, t.pes),
                ));
            }
        }
        let known = |name: &str, key: &str| -> Result<(), ScenarioError> {
            if names.contains(name) {
                Ok(())
            } else {
                Err(err(
                    top(key),
                    format!("fleet.{key}: unknown instance type {name:?} (known: {})", list(&names)),
                ))
            }
        };
        known(&scenario.fleet.on_demand, "onDemand")?;
        if scenario.fleet.spot.is_empty() && job.launch_members.len() > job.on_demand as usize {
            return Err(err(top("spot"), "fleet.spot is empty but the job has spot members".into()));
        }
        for t in &scenario.fleet.spot {
            known(t, "spot")?;
        }
        if let Some(t) = &scenario.fleet.replacement {
            known(t, "replacement")?;
        }
        for (from, to) in &scenario.fleet.replace_with {
            known(from, "replaceWith")?;
            known(to, "replaceWith")?;
        }
        if !(scenario.fleet.boot_seconds.is_finite() && scenario.fleet.boot_seconds >= 0.0) {
            return Err(err(top("bootSeconds"), "bootSeconds must not be negative".into()));
        }

        let mut scripted = Vec::new();
        for (i, e) in scenario.events.iter().enumerate() {
            let line = event_lines.get(i).copied();
            let mut event = check_event(e, job).map_err(|m| err(line, m))?;
            event.line = line.unwrap_or(0);
            scripted.push(event);
        }
        if let Some(r) = &scenario.random {
            let line = top("random");
            let positive = |v: f64| v.is_finite() && v >= 0.0;
            let rates = positive(r.notices_per_instance_hour) && positive(r.terminations_per_instance_hour);
            if !(rates && positive(r.until) && positive(r.recommendation_lead)) {
                return Err(err(line, "random: rates and times must not be negative".into()));
            }
            if !(r.deadline.is_finite() && r.deadline > 0.0) || r.batch == 0 {
                return Err(err(line, "random: deadline and batch must be positive".into()));
            }
        }
        scripted.sort_by_key(|s| s.at);
        Ok((scenario, scripted))
    }

    /// The instance type named `name` (validated to exist).
    pub fn instance_type(&self, name: &str) -> Option<&InstanceType> {
        self.instance_types.iter().find(|t| t.name == name)
    }

    /// PEs of the instance type named `name` (1 for an unknown name,
    /// which validation refuses).
    pub fn pes_of(&self, name: &str) -> u32 {
        self.instance_type(name).map_or(1, |t| t.pes)
    }

    /// The types the job's instances may run on: on-demand, spot,
    /// newcomers and replacements, each once.
    pub fn fleet_types(&self) -> BTreeSet<&str> {
        let f = &self.fleet;
        std::iter::once(f.on_demand.as_str())
            .chain(f.spot.iter().map(String::as_str))
            .chain(f.replacement.as_deref())
            .chain(f.replace_with.values().map(String::as_str))
            .collect()
    }
}

fn list(names: &BTreeSet<&str>) -> String {
    names.iter().copied().collect::<Vec<_>>().join(", ")
}

fn seconds(value: f64, what: &str) -> Result<Duration, String> {
    if value.is_finite() && value >= 0.0 {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(format!("{what} must be a non-negative number of seconds, not {value}"))
    }
}

fn check_event(e: &EventEntry, job: &JobShape) -> Result<Scripted, String> {
    let at = seconds(e.at, "at")?;
    let target = |name: &String| -> Result<String, String> {
        let is_newcomer = name
            .strip_prefix(&job.newcomer_prefix)
            .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()));
        if job.launch_members.contains(name) || is_newcomer {
            Ok(name.clone())
        } else {
            Err(format!(
                "no instance {name:?}: the job's members are {} and newcomers {}0, {}1, ...",
                job.launch_members.join(", "),
                job.newcomer_prefix,
                job.newcomer_prefix
            ))
        }
    };
    let mut actions = Vec::new();
    if let Some(name) = &e.rebalance_recommendation {
        actions.push(Action::Recommend(target(name)?));
    }
    if let Some(name) = &e.interruption {
        let deadline = seconds(e.deadline.unwrap_or(DEFAULT_NOTICE_SECONDS), "deadline")?;
        actions.push(Action::Interrupt {
            instance: target(name)?,
            deadline,
        });
    } else if e.deadline.is_some() {
        return Err("deadline belongs to an interruption".into());
    }
    if let Some(name) = &e.terminate {
        if job.launch_members.first() == Some(name) {
            // The job has no other root: node 0 (PE 0, the control
            // endpoint, the coordinator's client) is never recovered from.
            return Err(format!(
                "terminate: {name} is node 0's instance, whose loss ends the job by design (fault tolerance recovers from the loss of any other member); terminate another instance"
            ));
        }
        actions.push(Action::Terminate(target(name)?));
    }
    if let Some(d) = e.no_spot_capacity {
        actions.push(Action::NoSpotCapacity(seconds(d, "noSpotCapacity")?));
    }
    match actions.len() {
        1 => Ok(Scripted {
            at,
            action: actions.remove(0),
            line: 0,
        }),
        0 => Err("an event needs one of rebalanceRecommendation, interruption, terminate, noSpotCapacity".into()),
        _ => Err("an event does one thing: split it into several entries".into()),
    }
}

/// 1-based line of the top-level (or any-level) `key:`.
fn key_line(text: &str, key: &str) -> Option<usize> {
    let wanted = format!("{key}:");
    text.lines()
        .position(|l| {
            let t = l.trim_start().trim_start_matches("- ");
            t.starts_with(&wanted)
        })
        .map(|i| i + 1)
}

/// 1-based lines where the items of the block sequence under `key:` start.
fn item_lines(text: &str, key: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let Some(start) = key_line(text, key) else {
        return Vec::new();
    };
    let key_indent = indent(lines[start - 1]);
    let mut item_indent = None;
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate().skip(start) {
        let t = l.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let ind = indent(l);
        if ind < key_indent || (ind == key_indent && !t.starts_with('-')) {
            break;
        }
        if t.starts_with('-') && item_indent.is_none_or(|w| w == ind) {
            item_indent = Some(ind);
            out.push(i + 1);
        }
    }
    out
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobShape {
        JobShape {
            launch_members: vec!["j-0".into(), "j-1".into(), "j-2".into()],
            on_demand: 1,
            newcomer_prefix: "j-n".into(),
        }
    }

    const GOOD: &str = "\
timeFactor: 10
instanceTypes:
  - name: big
    pes: 1
    speed: 1.0
    price: { onDemand: 0.1, spot: 0.04 }
  - name: small
    pes: 1
    speed: 0.5
    price: { onDemand: 0.05, spot: 0.02 }
fleet:
  onDemand: big
  spot: [big, small]
  bootSeconds: 20
events:
  - at: 30
    rebalanceRecommendation: j-1
  - at: 50
    interruption: j-2
    deadline: 90
  - at: 10
    noSpotCapacity: 40
  - at: 200
    terminate: j-n0
";

    #[test]
    fn a_good_scenario_loads_sorted_with_its_lines() {
        let (s, events) = Scenario::load("s.yaml", GOOD, &job()).expect("valid");
        assert_eq!(s.time_factor, 10.0);
        assert_eq!(s.fleet.boot_seconds, 20.0);
        assert_eq!(events.len(), 4);
        assert_eq!(events[0].action, Action::NoSpotCapacity(Duration::from_secs(40)));
        assert_eq!(
            events[2].action,
            Action::Interrupt {
                instance: "j-2".into(),
                deadline: Duration::from_secs(90)
            }
        );
        assert_eq!(events[3].action, Action::Terminate("j-n0".into()));
        assert_eq!(item_lines(GOOD, "events"), vec![16, 18, 21, 23]);
        assert_eq!(item_lines(GOOD, "instanceTypes"), vec![3, 7]);
    }

    fn refused(text: &str) -> ScenarioError {
        Scenario::load("s.yaml", text, &job()).expect_err("must be refused")
    }

    #[test]
    fn an_unknown_instance_type_is_refused_naming_its_line() {
        let e = refused(&GOOD.replace("spot: [big, small]", "spot: [big, tiny]"));
        assert_eq!(e.line, Some(13), "{e}");
        assert!(e.message.contains("unknown instance type \"tiny\""), "{e}");
        assert!(e.to_string().starts_with("s.yaml:13: "), "{e}");
    }

    #[test]
    fn a_negative_time_is_refused_naming_its_line() {
        let e = refused(&GOOD.replace("at: 50", "at: -5"));
        assert_eq!(e.line, Some(18), "{e}");
        assert!(e.message.contains("non-negative"), "{e}");
    }

    #[test]
    fn a_notice_for_a_member_that_does_not_exist_is_refused_naming_its_line() {
        let e = refused(&GOOD.replace("interruption: j-2", "interruption: j-7"));
        assert_eq!(e.line, Some(18), "{e}");
        assert!(e.message.contains("no instance \"j-7\""), "{e}");
    }

    #[test]
    fn network_defaults_to_loopback_and_takes_namespaces() {
        let (s, _) = Scenario::load("s.yaml", GOOD, &job()).expect("valid");
        assert_eq!(s.network, Network::Loopback);
        let text = GOOD.replace("timeFactor: 10\n", "timeFactor: 10\nnetwork: namespaces\n");
        let (s, _) = Scenario::load("s.yaml", &text, &job()).expect("valid");
        assert_eq!(s.network, Network::Namespaces);
        let text = GOOD.replace("timeFactor: 10\n", "timeFactor: 10\nnetwork: loopback\n");
        assert_eq!(Scenario::load("s.yaml", &text, &job()).expect("valid").0.network, Network::Loopback);
    }

    #[test]
    fn an_unknown_network_is_refused_naming_its_line() {
        let e = refused(&GOOD.replace("timeFactor: 10\n", "timeFactor: 10\nnetwork: vxlan\n"));
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("vxlan") && e.message.contains("namespaces"), "{e}");
        assert!(e.to_string().starts_with("s.yaml:2: "), "{e}");
    }

    #[test]
    fn syntax_type_and_shape_errors_are_refused() {
        let e = refused(&GOOD.replace("speed: 0.5", "speed: fast"));
        assert!(e.line.is_some(), "serde_yaml reports the line: {e}");
        let e = refused(&GOOD.replace("    rebalanceRecommendation: j-1", "    rebalanceRecommendation: j-1\n    terminate: j-1"));
        assert!(e.message.contains("one thing"), "{e}");
        let e = refused(&GOOD.replace("pes: 1\n    speed: 0.5", "pes: 0\n    speed: 0.5"));
        assert!(e.message.contains("pes must be from 1 to 1024, not 0"), "{e}");
        assert_eq!(e.line, Some(7));
        let e = refused(&GOOD.replace("timeFactor: 10", "timeFactor: 0"));
        assert_eq!(e.line, Some(1));
        let e = refused(&GOOD.replace("bootSeconds: 20", "bootSecs: 20"));
        assert!(e.message.contains("unknown field"), "{e}");
    }

    #[test]
    fn the_quota_period_defaults_to_10_ms_and_stays_within_the_kernel_s_range() {
        let (s, _) = Scenario::load("s.yaml", GOOD, &job()).expect("valid");
        assert_eq!(s.cpu_period_ms, 10.0);
        let short = GOOD.replace("timeFactor: 10\n", "timeFactor: 10\ncpuPeriodMs: 1\n");
        let (s, _) = Scenario::load("s.yaml", &short, &job()).expect("valid");
        assert_eq!(s.cpu_period_ms, 1.0);
        for bad in ["0.5", "1001", "-3", ".nan"] {
            let e = refused(&GOOD.replace("timeFactor: 10\n", &format!("timeFactor: 10\ncpuPeriodMs: {bad}\n")));
            assert_eq!(e.line, Some(2), "{bad}: {e}");
            assert!(e.message.contains("cpuPeriodMs must be from 1 to 1000"), "{bad}: {e}");
        }
    }

    #[test]
    fn instance_types_of_different_pe_counts_share_a_fleet() {
        let text = GOOD
            .replace("pes: 1\n    speed: 0.5", "pes: 2\n    speed: 0.5")
            .replace("  bootSeconds: 20\n", "  bootSeconds: 20\n  replaceWith: { big: small }\n");
        let (s, _) = Scenario::load("s.yaml", &text, &job()).expect("mixed shapes are valid");
        assert_eq!((s.pes_of("big"), s.pes_of("small")), (1, 2));
        assert_eq!(s.fleet.replace_with.get("big").map(String::as_str), Some("small"));
        assert_eq!(s.fleet_types().into_iter().collect::<Vec<_>>(), ["big", "small"]);
    }

    #[test]
    fn terminating_node_zeros_instance_is_refused_naming_its_line() {
        let e = refused(&GOOD.replace("terminate: j-n0", "terminate: j-0"));
        assert_eq!(e.line, Some(23), "{e}");
        assert!(e.message.contains("j-0 is node 0's instance"), "{e}");
        assert!(e.message.contains("ends the job by design"), "{e}");
        // Any other member may be: a launch spot member, on-demand or not.
        let (_, events) = Scenario::load("s.yaml", &GOOD.replace("terminate: j-n0", "terminate: j-1"), &job()).expect("valid");
        assert_eq!(events[3].action, Action::Terminate("j-1".into()));
    }

    #[test]
    fn random_unannounced_terminations_take_a_non_negative_rate() {
        let random = "random: { seed: 1, noticesPerInstanceHour: 0, terminationsPerInstanceHour: 30, until: 600 }\n";
        let (s, _) = Scenario::load("s.yaml", &format!("{GOOD}{random}"), &job()).expect("valid");
        assert_eq!(s.random.map(|r| r.terminations_per_instance_hour), Some(30.0));
        let e = refused(&format!("{GOOD}{}", random.replace("30", "-1")));
        assert_eq!(e.line, Some(25), "{e}");
        assert!(e.message.contains("must not be negative"), "{e}");
    }

    #[test]
    fn a_replacement_map_naming_an_unknown_type_is_refused_naming_its_line() {
        let text = GOOD.replace("  bootSeconds: 20\n", "  bootSeconds: 20\n  replaceWith: { big: huge }\n");
        let e = refused(&text);
        assert_eq!(e.line, Some(15), "{e}");
        assert!(e.message.contains("fleet.replaceWith: unknown instance type \"huge\""), "{e}");
    }
}
