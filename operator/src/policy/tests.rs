//! Table-driven scenarios for each rule, and properties over random event
//! sequences. Time is virtual (seconds from the job's start).

use super::*;
use proptest::prelude::*;

fn id(name: &str) -> MemberId {
    MemberId::from(name)
}

fn ids(names: &[&str]) -> Vec<MemberId> {
    names.iter().map(|n| id(n)).collect()
}

fn s(secs: u64) -> Time {
    Duration::from_secs(secs)
}

fn config() -> PolicyConfig {
    PolicyConfig {
        newcomer_prefix: "job-n".to_owned(),
        max_replicas: Some(8),
        ..PolicyConfig::default()
    }
}

/// One step of a scenario: an event at a time, or a call to `decide` at a
/// time with the exact decisions expected.
enum Step {
    At(u64, Event),
    Decide(u64, Vec<Decision>),
}
use Step::{At, Decide};

struct Scenario {
    name: &'static str,
    config: PolicyConfig,
    /// Launch members: `job-0` (root, on-demand), then `on_demand - 1` more
    /// on-demand, then spot, up to `launch` members.
    launch: u32,
    on_demand: u32,
    desired: u32,
    steps: Vec<Step>,
}

fn rebalance(member: &str) -> Event {
    Event::RebalanceRecommendation { member: id(member) }
}
fn notice(member: &str, deadline: Option<u64>) -> Event {
    Event::InterruptionNotice {
        member: id(member),
        deadline: deadline.map(s),
    }
}
fn ready(newcomer: &str) -> Event {
    Event::NewcomerReady {
        newcomer: id(newcomer),
    }
}
fn gone(member: &str) -> Event {
    Event::MemberGone { member: id(member) }
}
fn committed(epoch: u64, admitted: &[&str]) -> Event {
    Event::RescaleCommitted {
        epoch,
        admitted: ids(admitted),
    }
}
/// A newcomer that became a member without a rescale the policy asked
/// for: a recovery's commit admits every newcomer waiting.
fn joined(newcomer: &str) -> Event {
    Event::MemberJoined {
        member: id(newcomer),
        capacity: Capacity::Spot,
        root: false,
    }
}
fn replace(member: &str, newcomer: &str) -> Decision {
    Decision::LaunchReplacement {
        for_member: id(member),
        newcomer: id(newcomer),
    }
}
fn rescale(remove: &[&str], admit: u32, reason: RescaleReason) -> Decision {
    Decision::Rescale {
        remove: ids(remove),
        admit,
        reason,
    }
}
fn cancel(newcomers: &[&str], reason: CancelReason) -> Decision {
    Decision::CancelNewcomers {
        newcomers: ids(newcomers),
        reason,
    }
}
fn launch(newcomers: &[&str]) -> Decision {
    Decision::LaunchNewcomers {
        newcomers: ids(newcomers),
    }
}
fn desired(replicas: u32) -> Event {
    Event::DesiredReplicas { replicas }
}
fn vacated(member: &str) -> Decision {
    Decision::DeleteVacated { member: id(member) }
}

fn start(scenario: &Scenario) -> Policy {
    let mut policy = Policy::new(scenario.config.clone(), scenario.desired);
    for k in 0..scenario.launch {
        policy.observe(
            s(0),
            Event::MemberJoined {
                member: MemberId(format!("job-{k}")),
                capacity: if k < scenario.on_demand {
                    Capacity::OnDemand
                } else {
                    Capacity::Spot
                },
                root: k == 0,
            },
        );
    }
    policy
}

fn run(scenario: Scenario) {
    let mut policy = start(&scenario);
    for (i, step) in scenario.steps.into_iter().enumerate() {
        match step {
            At(t, event) => policy.observe(s(t), event),
            Decide(t, expected) => {
                let got = policy.decide(s(t));
                assert_eq!(
                    got, expected,
                    "scenario `{}`, step {i} (decide at {t}s)",
                    scenario.name
                );
            }
        }
    }
}

fn scenarios() -> Vec<Scenario> {
    use CancelReason::{AtRisk, Surplus};
    use RescaleReason::*;
    vec![
        Scenario {
            name: "a lowered target cancels surplus launches, unregistered and newest first",
            config: config(),
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, desired(6)),
                Decide(0, vec![launch(&["job-n0", "job-n1", "job-n2"])]),
                At(5, ready("job-n0")),
                At(5, desired(4)),
                Decide(
                    5,
                    vec![
                        cancel(&["job-n2", "job-n1"], Surplus),
                        rescale(&[], 1, ScaleUp),
                    ],
                ),
                // A cancelled newcomer that registers anyway is not admitted.
                At(6, ready("job-n2")),
                At(6, committed(2, &["job-n0"])),
                Decide(6, vec![]),
                At(7, desired(3)),
                Decide(7, vec![rescale(&["job-n0"], 0, ScaleDown)]),
            ],
        },
        Scenario {
            name: "waiting newcomers are cancelled too, but not while a rescale may admit them",
            config: config(),
            launch: 2,
            on_demand: 1,
            desired: 2,
            steps: vec![
                At(0, desired(4)),
                Decide(0, vec![launch(&["job-n0", "job-n1"])]),
                At(1, ready("job-n0")),
                At(1, ready("job-n1")),
                Decide(1, vec![rescale(&[], 2, ScaleUp)]),
                At(2, desired(2)),
                Decide(2, vec![]),
                At(
                    3,
                    Event::RescaleFailed {
                        reason: "busy".into(),
                    },
                ),
                Decide(
                    3,
                    vec![
                        Decision::Report(Report::RescaleFailed {
                            reason: "busy".into(),
                        }),
                        cancel(&["job-n1", "job-n0"], Surplus),
                    ],
                ),
            ],
        },
        Scenario {
            name: "a newcomer whose own node gets a notice is cancelled and replaced",
            config: config(),
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, rebalance("job-2")),
                Decide(0, vec![replace("job-2", "job-n0")]),
                At(5, ready("job-n0")),
                At(6, rebalance("job-n0")),
                Decide(
                    6,
                    vec![cancel(&["job-n0"], AtRisk), replace("job-2", "job-n1")],
                ),
                At(10, ready("job-n0")),
                Decide(10, vec![]),
                At(20, ready("job-n1")),
                Decide(20, vec![rescale(&["job-2"], 1, CompleteReplacement)]),
            ],
        },
        Scenario {
            name: "complete replacement: one rescale once every at-risk member is replaced",
            config: config(),
            launch: 4,
            on_demand: 1,
            desired: 4,
            steps: vec![
                Decide(0, vec![]),
                At(0, rebalance("job-1")),
                Decide(0, vec![replace("job-1", "job-n0")]),
                At(5, rebalance("job-2")),
                Decide(5, vec![replace("job-2", "job-n1")]),
                At(10, ready("job-n0")),
                Decide(10, vec![]),
                At(20, ready("job-n1")),
                Decide(
                    20,
                    vec![rescale(&["job-1", "job-2"], 2, CompleteReplacement)],
                ),
                Decide(21, vec![]),
                At(22, committed(2, &["job-n0", "job-n1"])),
                At(23, gone("job-1")),
                At(23, gone("job-2")),
                Decide(23, vec![vacated("job-1"), vacated("job-2")]),
                Decide(500, vec![]),
            ],
        },
        Scenario {
            name: "emergency: a notice rescales at once, the interrupted member replaced first",
            config: config(),
            launch: 4,
            on_demand: 1,
            desired: 4,
            steps: vec![
                At(0, rebalance("job-1")),
                At(0, rebalance("job-2")),
                Decide(
                    0,
                    vec![replace("job-1", "job-n0"), replace("job-2", "job-n1")],
                ),
                At(10, ready("job-n0")),
                Decide(10, vec![]),
                At(15, notice("job-2", Some(135))),
                Decide(15, vec![rescale(&["job-2"], 1, Emergency)]),
                At(16, committed(2, &["job-n0"])),
                // job-1 stays at risk and keeps running; its replacement is on its way.
                Decide(16, vec![]),
                At(30, ready("job-n1")),
                Decide(30, vec![rescale(&["job-1"], 1, CompleteReplacement)]),
            ],
        },
        Scenario {
            name: "emergency with no replacement ready shrinks, then grows back",
            config: config(),
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, notice("job-2", None)),
                Decide(
                    0,
                    vec![
                        replace("job-2", "job-n0"),
                        rescale(&["job-2"], 0, Emergency),
                    ],
                ),
                At(1, committed(2, &[])),
                At(2, gone("job-2")),
                Decide(2, vec![vacated("job-2")]),
                At(40, ready("job-n0")),
                Decide(40, vec![rescale(&[], 1, ScaleUp)]),
            ],
        },
        Scenario {
            name: "timeout: rescale with what is ready, then take each replacement at once",
            config: config(),
            launch: 4,
            on_demand: 1,
            desired: 4,
            steps: vec![
                At(0, rebalance("job-1")),
                At(0, rebalance("job-2")),
                Decide(
                    0,
                    vec![replace("job-1", "job-n0"), replace("job-2", "job-n1")],
                ),
                At(30, ready("job-n0")),
                Decide(30, vec![]),
                Decide(119, vec![]),
                Decide(120, vec![rescale(&["job-1"], 1, Timeout)]),
                At(121, committed(2, &["job-n0"])),
                At(130, ready("job-n1")),
                Decide(130, vec![rescale(&["job-2"], 1, Timeout)]),
            ],
        },
        Scenario {
            name: "a replacement that never comes: the member keeps running until its notice",
            config: config(),
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, rebalance("job-1")),
                Decide(0, vec![replace("job-1", "job-n0")]),
                Decide(120, vec![]),
                Decide(600, vec![]),
                At(700, notice("job-1", Some(820))),
                Decide(700, vec![rescale(&["job-1"], 0, Emergency)]),
            ],
        },
        Scenario {
            name: "no shrinking: an unreplaced interrupted member is reported, not removed",
            config: PolicyConfig {
                shrink_when_no_replacement: false,
                ..config()
            },
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, notice("job-1", Some(120))),
                Decide(
                    0,
                    vec![
                        replace("job-1", "job-n0"),
                        Decision::Report(Report::NoReplacementByDeadline {
                            member: id("job-1"),
                        }),
                    ],
                ),
                Decide(1, vec![]),
                At(20, ready("job-n0")),
                Decide(20, vec![rescale(&["job-1"], 1, Emergency)]),
            ],
        },
        Scenario {
            name: "deadline without emergency: removed at deadline minus the margin",
            config: PolicyConfig {
                emergency_on_interruption: false,
                ..config()
            },
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, notice("job-2", Some(120))),
                Decide(0, vec![replace("job-2", "job-n0")]),
                Decide(89, vec![]),
                Decide(90, vec![rescale(&["job-2"], 0, Deadline)]),
            ],
        },
        Scenario {
            name: "deadline without emergency: a replacement before it completes the swap",
            config: PolicyConfig {
                emergency_on_interruption: false,
                ..config()
            },
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, notice("job-2", Some(120))),
                Decide(0, vec![replace("job-2", "job-n0")]),
                At(60, ready("job-n0")),
                Decide(60, vec![rescale(&["job-2"], 1, CompleteReplacement)]),
            ],
        },
        Scenario {
            name: "immediate: one rescale per ready replacement",
            config: PolicyConfig {
                mode: RebalanceMode::Immediate,
                ..config()
            },
            launch: 4,
            on_demand: 1,
            desired: 4,
            steps: vec![
                At(0, rebalance("job-1")),
                At(0, rebalance("job-2")),
                Decide(
                    0,
                    vec![replace("job-1", "job-n0"), replace("job-2", "job-n1")],
                ),
                At(10, ready("job-n1")),
                Decide(10, vec![rescale(&["job-1"], 1, Immediate)]),
                At(11, committed(2, &["job-n1"])),
                At(12, ready("job-n0")),
                Decide(12, vec![rescale(&["job-2"], 1, Immediate)]),
            ],
        },
        Scenario {
            name: "notice for PE 0's node: reported, never removed, nothing launched",
            config: config(),
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, notice("job-0", Some(120))),
                Decide(
                    0,
                    vec![Decision::Report(Report::ProtectedMemberAtRisk {
                        member: id("job-0"),
                        root: true,
                    })],
                ),
                Decide(100, vec![]),
                Decide(200, vec![]),
            ],
        },
        Scenario {
            name: "on-demand members are never removed, not even to scale down",
            config: config(),
            launch: 3,
            on_demand: 2,
            desired: 3,
            steps: vec![
                At(0, rebalance("job-1")),
                Decide(
                    0,
                    vec![Decision::Report(Report::ProtectedMemberAtRisk {
                        member: id("job-1"),
                        root: false,
                    })],
                ),
                At(1, Event::DesiredReplicas { replicas: 1 }),
                Decide(1, vec![rescale(&["job-2"], 0, ScaleDown)]),
            ],
        },
        Scenario {
            name: "scale up: launch newcomers, admit them together",
            config: config(),
            launch: 4,
            on_demand: 1,
            desired: 4,
            steps: vec![
                At(0, Event::DesiredReplicas { replicas: 6 }),
                Decide(
                    0,
                    vec![Decision::LaunchNewcomers {
                        newcomers: ids(&["job-n0", "job-n1"]),
                    }],
                ),
                At(5, ready("job-n0")),
                Decide(5, vec![]),
                At(9, ready("job-n1")),
                Decide(9, vec![rescale(&[], 2, ScaleUp)]),
            ],
        },
        Scenario {
            name: "scale up: a lone ready newcomer is admitted after the timeout",
            config: config(),
            launch: 2,
            on_demand: 1,
            desired: 4,
            steps: vec![
                Decide(
                    0,
                    vec![Decision::LaunchNewcomers {
                        newcomers: ids(&["job-n0", "job-n1"]),
                    }],
                ),
                At(5, ready("job-n1")),
                Decide(124, vec![]),
                Decide(125, vec![rescale(&[], 1, ScaleUp)]),
            ],
        },
        Scenario {
            name: "scale down: at-risk members first, then the newest spot members",
            config: config(),
            launch: 5,
            on_demand: 1,
            desired: 5,
            steps: vec![
                At(0, rebalance("job-2")),
                At(0, Event::DesiredReplicas { replicas: 3 }),
                Decide(0, vec![rescale(&["job-2", "job-4"], 0, ScaleDown)]),
            ],
        },
        Scenario {
            name: "min/max respected: desired sizes are clamped and reported",
            config: PolicyConfig {
                min_replicas: 2,
                max_replicas: Some(5),
                ..config()
            },
            launch: 4,
            on_demand: 1,
            desired: 4,
            steps: vec![
                At(0, Event::DesiredReplicas { replicas: 9 }),
                Decide(
                    0,
                    vec![
                        Decision::Report(Report::DesiredClamped {
                            requested: 9,
                            target: 5,
                        }),
                        Decision::LaunchNewcomers {
                            newcomers: ids(&["job-n0"]),
                        },
                    ],
                ),
                At(1, Event::DesiredReplicas { replicas: 0 }),
                Decide(
                    1,
                    vec![
                        Decision::Report(Report::DesiredClamped {
                            requested: 0,
                            target: 2,
                        }),
                        // The growth launch is no longer needed.
                        cancel(&["job-n0"], CancelReason::Surplus),
                        rescale(&["job-3", "job-2"], 0, ScaleDown),
                    ],
                ),
            ],
        },
        Scenario {
            name: "a forced shrink below minReplicas is reported",
            config: PolicyConfig {
                min_replicas: 3,
                ..config()
            },
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, notice("job-1", Some(120))),
                Decide(
                    0,
                    vec![
                        replace("job-1", "job-n0"),
                        Decision::Report(Report::BelowMinReplicas { members: 2, min: 3 }),
                        rescale(&["job-1"], 0, Emergency),
                    ],
                ),
            ],
        },
        Scenario {
            name: "a lost member is reported, its pod deleted, and the job grows back",
            config: config(),
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, gone("job-2")),
                Decide(
                    0,
                    vec![
                        vacated("job-2"),
                        Decision::Report(Report::MemberLost {
                            member: id("job-2"),
                        }),
                        Decision::LaunchNewcomers {
                            newcomers: ids(&["job-n0"]),
                        },
                    ],
                ),
            ],
        },
        Scenario {
            name: "a replacement admitted by a recovery is a member; its at-risk member gets another",
            config: config(),
            launch: 4,
            on_demand: 1,
            desired: 4,
            steps: vec![
                At(0, rebalance("job-2")),
                Decide(0, vec![replace("job-2", "job-n0")]),
                // job-3 is lost without notice just as job-n0 registers:
                // the runtime's recovery admits it.
                At(5, ready("job-n0")),
                At(5, gone("job-3")),
                At(5, joined("job-n0")),
                // job-n0 is a member: no rescale asks for it; job-2 is
                // still at risk and the job grows back towards 4 staying.
                Decide(
                    5,
                    vec![
                        vacated("job-3"),
                        Decision::Report(Report::MemberLost {
                            member: id("job-3"),
                        }),
                        launch(&["job-n1"]),
                    ],
                ),
                At(10, ready("job-n1")),
                Decide(10, vec![rescale(&["job-2"], 1, CompleteReplacement)]),
            ],
        },
        Scenario {
            name: "a failed rescale is retried after the delay, one in flight at a time",
            config: config(),
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, rebalance("job-1")),
                Decide(0, vec![replace("job-1", "job-n0")]),
                At(10, ready("job-n0")),
                Decide(10, vec![rescale(&["job-1"], 1, CompleteReplacement)]),
                Decide(11, vec![]),
                At(
                    12,
                    Event::RescaleFailed {
                        reason: "PE 0 unreachable".into(),
                    },
                ),
                Decide(
                    12,
                    vec![Decision::Report(Report::RescaleFailed {
                        reason: "PE 0 unreachable".into(),
                    })],
                ),
                Decide(21, vec![]),
                Decide(22, vec![rescale(&["job-1"], 1, CompleteReplacement)]),
            ],
        },
        Scenario {
            name: "a waiting newcomer warned while a rescale may admit it: admitted, it is an at-risk member",
            config: config(),
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, rebalance("job-2")),
                Decide(0, vec![replace("job-2", "job-n0")]),
                At(5, ready("job-n0")),
                Decide(5, vec![rescale(&["job-2"], 1, CompleteReplacement)]),
                // Not cancelled: the rescale in flight may be admitting it.
                At(6, notice("job-n0", Some(100))),
                Decide(6, vec![]),
                At(7, committed(2, &["job-n0"])),
                Decide(
                    7,
                    vec![
                        replace("job-n0", "job-n1"),
                        rescale(&["job-n0"], 0, Emergency),
                    ],
                ),
                At(8, committed(3, &[])),
                At(9, ready("job-n1")),
                Decide(9, vec![rescale(&[], 1, ScaleUp)]),
            ],
        },
        Scenario {
            name: "a waiting newcomer warned during a rescale that fails is cancelled then",
            config: config(),
            launch: 3,
            on_demand: 1,
            desired: 3,
            steps: vec![
                At(0, rebalance("job-2")),
                Decide(0, vec![replace("job-2", "job-n0")]),
                At(5, ready("job-n0")),
                Decide(5, vec![rescale(&["job-2"], 1, CompleteReplacement)]),
                At(6, rebalance("job-n0")),
                Decide(6, vec![]),
                At(
                    7,
                    Event::RescaleFailed {
                        reason: "busy".into(),
                    },
                ),
                Decide(
                    7,
                    vec![
                        cancel(&["job-n0"], AtRisk),
                        Decision::Report(Report::RescaleFailed {
                            reason: "busy".into(),
                        }),
                        replace("job-2", "job-n1"),
                    ],
                ),
            ],
        },
    ]
}

#[test]
fn scenarios_hold() {
    for scenario in scenarios() {
        run(scenario);
    }
}

#[test]
fn next_wakeup_points_at_the_timeout_and_the_deadline() {
    let mut policy = Policy::new(
        PolicyConfig {
            emergency_on_interruption: false,
            ..config()
        },
        3,
    );
    for (k, capacity) in [
        (0, Capacity::OnDemand),
        (1, Capacity::Spot),
        (2, Capacity::Spot),
    ] {
        policy.observe(
            s(0),
            Event::MemberJoined {
                member: MemberId(format!("job-{k}")),
                capacity,
                root: k == 0,
            },
        );
    }
    assert_eq!(policy.next_wakeup(s(0)), None);
    policy.observe(s(10), rebalance("job-1"));
    assert_eq!(policy.next_wakeup(s(10)), Some(s(130)));
    policy.observe(s(20), notice("job-2", Some(100)));
    assert_eq!(policy.next_wakeup(s(20)), Some(s(70)));
    // Past wakeups are not reported again.
    assert_eq!(policy.next_wakeup(s(70)), Some(s(130)));
}

/// A spec change while the job runs: the next decision follows the new
/// bounds and mode, without a new policy (an operator restart).
#[test]
fn a_reconfigured_policy_follows_its_new_bounds_and_mode() {
    let mut policy = Policy::new(config(), 4);
    for k in 0..4 {
        policy.observe(
            s(0),
            Event::MemberJoined {
                member: MemberId(format!("job-{k}")),
                capacity: if k == 0 { Capacity::OnDemand } else { Capacity::Spot },
                root: k == 0,
            },
        );
    }
    assert_eq!(policy.decide(s(1)), vec![]);
    // maxReplicas 8 -> 3: replicas 4 no longer fits; the newest spot member goes.
    policy.reconfigure(
        PolicyConfig {
            max_replicas: Some(3),
            ..config()
        },
        4,
    );
    assert_eq!(policy.target(), 3);
    assert_eq!(
        policy.decide(s(2)),
        vec![
            Decision::Report(Report::DesiredClamped {
                requested: 4,
                target: 3
            }),
            rescale(&["job-3"], 0, RescaleReason::ScaleDown),
        ]
    );
    policy.observe(s(3), committed(2, &[]));
    policy.observe(s(3), gone("job-3"));
    assert_eq!(policy.decide(s(3)), vec![vacated("job-3")]);
    // CompleteReplacement -> Immediate: one ready replacement of two is
    // swapped in at once instead of waiting for the other.
    let prefix = policy.config().newcomer_prefix.clone();
    policy.reconfigure(
        PolicyConfig {
            mode: RebalanceMode::Immediate,
            max_replicas: Some(3),
            newcomer_prefix: "ignored-".to_owned(),
            ..config()
        },
        4,
    );
    assert_eq!(policy.config().newcomer_prefix, prefix, "names stay the job's");
    policy.observe(s(10), rebalance("job-1"));
    policy.observe(s(10), rebalance("job-2"));
    assert_eq!(
        policy.decide(s(10)),
        vec![
            Decision::Report(Report::DesiredClamped {
                requested: 4,
                target: 3
            }),
            replace("job-1", "job-n0"),
            replace("job-2", "job-n1"),
        ]
    );
    policy.observe(s(11), ready("job-n0"));
    assert_eq!(
        policy.decide(s(11)),
        vec![rescale(&["job-1"], 1, RescaleReason::Immediate)]
    );
}

#[test]
fn config_from_spec_fills_defaults() {
    let spec: ElasticJobSpec = serde_json::from_value(serde_json::json!({
        "template": {"spec": {"containers": [{"name": "node", "image": "x"}]}},
        "replicas": 4, "minReplicas": 2, "maxReplicas": 6,
        "rescalePolicy": {"rebalance": {"mode": "Immediate", "timeoutSeconds": 60}}
    }))
    .unwrap();
    let config = PolicyConfig::from_spec("jacobi", &spec);
    assert_eq!(config.mode, RebalanceMode::Immediate);
    assert_eq!(config.rebalance_timeout, s(60));
    assert!(config.emergency_on_interruption);
    assert_eq!((config.min_replicas, config.max_replicas), (2, Some(6)));
    assert_eq!(config.newcomer_prefix, "jacobi-n");
    assert_eq!(config.clamp(10), 6);
    assert_eq!(config.clamp(0), 2);
}

// ---- properties ----------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Rebalance(usize),
    Notice(usize, u64),
    NewcomerAtRisk(usize),
    NewcomerUp(usize),
    NewcomerFails(usize),
    Desired(u32),
    /// The spec's bounds and rescale policy change while the job runs:
    /// (minReplicas, maxReplicas - minReplicas, Immediate, emergency).
    Reconfigure(u32, u32, bool, bool),
    FailNextRescale,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..90).prop_map(Op::Advance),
        2 => (0usize..16).prop_map(Op::Rebalance),
        1 => (0usize..16).prop_map(Op::NewcomerAtRisk),
        2 => (0usize..16, 0u64..150).prop_map(|(m, d)| Op::Notice(m, d)),
        3 => (0usize..16).prop_map(Op::NewcomerUp),
        1 => (0usize..16).prop_map(Op::NewcomerFails),
        1 => (0u32..12).prop_map(Op::Desired),
        1 => Just(Op::FailNextRescale),
        1 => (1u32..5, 0u32..6, any::<bool>(), any::<bool>())
            .prop_map(|(min, span, immediate, emergency)| Op::Reconfigure(min, span, immediate, emergency)),
    ]
}

struct Harness {
    policy: Policy,
    config: PolicyConfig,
    now: Time,
    /// Newcomers launched by the policy, not yet up.
    launched: Vec<MemberId>,
    /// Newcomers up (registered), not yet admitted.
    pending: Vec<MemberId>,
    /// Deadlines of interrupted members: they must be gone by then.
    deadlines: BTreeMap<MemberId, Time>,
    fail_next: bool,
    /// The job's `replicas`, as last told to the policy.
    desired: u32,
    /// Newcomers the policy cancelled.
    cancelled: BTreeSet<MemberId>,
    members: BTreeSet<MemberId>,
    /// Node 0 and the other on-demand members.
    protected: BTreeSet<MemberId>,
}

impl Harness {
    fn new(config: PolicyConfig, launch: u32, on_demand: u32) -> Self {
        let mut policy = Policy::new(config.clone(), launch);
        let mut members = BTreeSet::new();
        let mut protected = BTreeSet::new();
        for k in 0..launch {
            let member = MemberId(format!("job-{k}"));
            members.insert(member.clone());
            if k < on_demand {
                protected.insert(member.clone());
            }
            policy.observe(
                s(0),
                Event::MemberJoined {
                    member,
                    capacity: if k < on_demand {
                        Capacity::OnDemand
                    } else {
                        Capacity::Spot
                    },
                    root: k == 0,
                },
            );
        }
        Harness {
            policy,
            config,
            now: s(0),
            launched: Vec::new(),
            pending: Vec::new(),
            deadlines: BTreeMap::new(),
            fail_next: false,
            desired: launch,
            cancelled: BTreeSet::new(),
            members,
            protected,
        }
    }

    fn pick(&self, k: usize) -> Option<MemberId> {
        let list: Vec<&MemberId> = self.members.iter().collect();
        (!list.is_empty()).then(|| list[k % list.len()].clone())
    }

    /// Calls decide and carries the decisions out as a prompt driver would:
    /// a rescale commits (or fails) at once, and removed members leave.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..8 {
            let decisions = self.policy.decide(self.now);
            if decisions.is_empty() {
                return Ok(());
            }
            for decision in decisions {
                self.check_and_apply(decision)?;
            }
        }
        Ok(())
    }

    fn check_and_apply(&mut self, decision: Decision) -> Result<(), TestCaseError> {
        match decision {
            Decision::LaunchReplacement { newcomer, .. } => self.launched.push(newcomer),
            Decision::LaunchNewcomers { newcomers } => self.launched.extend(newcomers),
            Decision::Rescale {
                remove,
                admit,
                reason,
            } => {
                prop_assert!(
                    !remove.contains(&id("job-0")),
                    "node 0 chosen for removal: {remove:?}"
                );
                prop_assert!(
                    remove.iter().all(|m| !self.protected.contains(m)),
                    "on-demand member chosen for removal: {remove:?}"
                );
                let before = self.members.len();
                let forced = remove
                    .iter()
                    .filter(|m| self.deadlines.contains_key(*m))
                    .count();
                let admitted: Vec<MemberId> =
                    self.pending.iter().take(admit as usize).cloned().collect();
                prop_assert!(
                    admitted.iter().all(|a| !self.cancelled.contains(a)),
                    "a cancelled newcomer is admitted: {admitted:?}"
                );
                let after = before - remove.len() + admitted.len();
                let max = self.config.max_replicas.unwrap_or(u32::MAX) as usize;
                let min = self.config.min_replicas as usize;
                prop_assert!(
                    after <= max.max(before),
                    "{reason}: {before} -> {after} > max {max}"
                );
                prop_assert!(
                    after >= min.min(before - forced),
                    "{reason}: {before} -> {after} below min {min} (forced {forced})"
                );
                if self.fail_next {
                    self.fail_next = false;
                    self.policy.observe(
                        self.now,
                        Event::RescaleFailed {
                            reason: "injected".into(),
                        },
                    );
                    return Ok(());
                }
                self.pending.retain(|p| !admitted.contains(p));
                for member in &remove {
                    self.members.remove(member);
                    self.deadlines.remove(member);
                }
                self.members.extend(admitted.iter().cloned());
                self.policy
                    .observe(self.now, Event::RescaleCommitted { epoch: 0, admitted });
                for member in remove {
                    self.policy.observe(self.now, Event::MemberGone { member });
                }
            }
            Decision::CancelNewcomers { newcomers, .. } => {
                for newcomer in &newcomers {
                    prop_assert!(
                        self.launched.contains(newcomer) || self.pending.contains(newcomer),
                        "cancelled {newcomer}, which is neither launched nor waiting"
                    );
                }
                self.launched.retain(|n| !newcomers.contains(n));
                self.pending.retain(|n| !newcomers.contains(n));
                self.cancelled.extend(newcomers);
            }
            Decision::DeleteVacated { .. } | Decision::Report(_) => {}
        }
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Advance(secs) => {
                // A driver that honours next_wakeup: never sleep past it.
                let target = self.now + s(secs);
                while self.now < target {
                    let wake = self.policy.next_wakeup(self.now);
                    self.now = wake.map_or(target, |w| w.min(target));
                    self.settle()?;
                    self.check_deadlines()?;
                }
            }
            Op::Rebalance(k) => {
                if let Some(member) = self.pick(k) {
                    self.policy
                        .observe(self.now, Event::RebalanceRecommendation { member });
                }
            }
            Op::Notice(k, secs) => {
                if let Some(member) = self.pick(k) {
                    // Margin plus one second at least: the policy needs time to act.
                    let deadline = self.now + self.config.evacuation_margin + s(1 + secs);
                    if !self.protected.contains(&member) {
                        let entry = self.deadlines.entry(member.clone()).or_insert(deadline);
                        *entry = (*entry).min(deadline);
                    }
                    self.policy.observe(
                        self.now,
                        Event::InterruptionNotice {
                            member,
                            deadline: Some(deadline),
                        },
                    );
                }
            }
            Op::NewcomerAtRisk(k) => {
                let waiting: Vec<MemberId> =
                    self.launched.iter().chain(&self.pending).cloned().collect();
                if !waiting.is_empty() {
                    let member = waiting[k % waiting.len()].clone();
                    self.policy
                        .observe(self.now, Event::RebalanceRecommendation { member });
                }
            }
            Op::NewcomerUp(k) => {
                if !self.launched.is_empty() {
                    let newcomer = self.launched.remove(k % self.launched.len());
                    self.pending.push(newcomer.clone());
                    self.policy
                        .observe(self.now, Event::NewcomerReady { newcomer });
                }
            }
            Op::NewcomerFails(k) => {
                if !self.launched.is_empty() {
                    let newcomer = self.launched.remove(k % self.launched.len());
                    self.policy
                        .observe(self.now, Event::MemberGone { member: newcomer });
                }
            }
            Op::Desired(n) => {
                self.desired = n;
                self.policy
                    .observe(self.now, Event::DesiredReplicas { replicas: n })
            }
            Op::Reconfigure(min, span, immediate, emergency) => {
                self.config = PolicyConfig {
                    min_replicas: min,
                    max_replicas: Some(min + span),
                    mode: if immediate {
                        RebalanceMode::Immediate
                    } else {
                        RebalanceMode::CompleteReplacement
                    },
                    emergency_on_interruption: emergency,
                    ..self.config.clone()
                };
                self.policy.reconfigure(self.config.clone(), self.desired);
                prop_assert_eq!(self.policy.target(), self.config.clamp(self.desired));
            }
            Op::FailNextRescale => self.fail_next = true,
        }
        self.settle()?;
        self.check_deadlines()
    }

    /// Every interrupted spot member is out of the job by its deadline.
    fn check_deadlines(&self) -> Result<(), TestCaseError> {
        for (member, deadline) in &self.deadlines {
            prop_assert!(
                self.now < *deadline || !self.members.contains(member),
                "{member} still a member at {:?}, past its deadline {:?}",
                self.now,
                deadline
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Node 0 and on-demand members are never removed; sizes stay in
    /// [min, max] (the bounds in force, which may change while the job
    /// runs) but for forced (interruption) removals; every interrupted
    /// member has left by its deadline.
    #[test]
    fn policy_invariants(
        emergency in any::<bool>(),
        immediate in any::<bool>(),
        launch in 2u32..7,
        min in 1u32..4,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let min = min.min(launch);
        let config = PolicyConfig {
            mode: if immediate { RebalanceMode::Immediate } else { RebalanceMode::CompleteReplacement },
            emergency_on_interruption: emergency,
            min_replicas: min,
            max_replicas: Some(launch + 2),
            // Retries must not outlast the shortest deadline window.
            retry_after: s(5),
            ..config()
        };
        let mut harness = Harness::new(config, launch, 2.min(min).max(1));
        for op in ops {
            harness.apply(op)?;
        }
        harness.apply(Op::Advance(400))?;
    }
}

#[test]
fn a_restarted_driver_never_reuses_an_existing_newcomer_name() {
    let mut policy = Policy::new(config(), 3);
    let prefix = config().newcomer_prefix;
    let taken = [
        format!("{prefix}0"),
        format!("{prefix}4"),
        "other-7".to_owned(),
        format!("{prefix}x"),
    ];
    policy.reserve_names(taken.iter().map(String::as_str));
    policy.observe(
        s(0),
        Event::MemberJoined {
            member: id("a"),
            capacity: Capacity::OnDemand,
            root: true,
        },
    );
    let decisions = policy.decide(s(0));
    assert_eq!(
        decisions,
        [Decision::LaunchNewcomers {
            newcomers: ids(&[&format!("{prefix}5"), &format!("{prefix}6")])
        }]
    );
}
