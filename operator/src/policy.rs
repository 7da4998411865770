//! The rescale policy: when to launch replacements and newcomers, and when to
//! ask the job to rescale. Pure code (sans-IO, virtual time), driven by the
//! Kubernetes reconciler and, later, by the local fleet: both feed it the same
//! [`Event`]s and carry out the same [`Decision`]s.
//!
//! The rules follow the capacity-rebalancing policy of CharmCloudManager
//! (adaptive-runtime-cloud-hpc, section IV-B), extended with the job's size
//! bounds:
//!
//! * **replacement**: each at-risk spot member (rebalance recommendation or
//!   interruption notice) gets a replacement newcomer launched at once;
//! * **complete replacement** (mode `CompleteReplacement`): the job rescales
//!   once every at-risk member has a ready replacement, swapping them all in
//!   one rescale;
//! * **emergency**: an interruption notice forces a rescale now, with
//!   whatever replacements are ready (the interrupted members are paired
//!   first); at-risk members left unpaired keep running;
//! * **timeout**: `timeout` after the oldest rebalance recommendation, the
//!   job rescales with the replacements that are ready, and from then on
//!   takes each replacement as soon as it is ready;
//! * **immediate** (mode `Immediate`): one rescale per ready replacement;
//! * **deadline**: without emergency rescales, an interrupted member is
//!   removed at its deadline minus an evacuation margin at the latest; with
//!   no replacement ready it is removed anyway (the job shrinks) when
//!   `shrink_when_no_replacement` is set, else it is reported and lost;
//! * **scale up/down**: the desired size, clamped to `[min, max]`, is reached
//!   by admitting ready newcomers or removing members (at-risk first, then
//!   the newest spot members);
//! * **protected members**: node 0 (PE 0) and the on-demand members are never
//!   chosen for removal; a notice for one is reported;
//! * **cancelled newcomers**: launched or waiting newcomers beyond what the
//!   target needs (after `replicas` went down) are cancelled, those not yet
//!   registered first; a newcomer whose own instance gets a notice is
//!   cancelled at once (it is not worth admitting) and replaced when the job
//!   still needs one, unless a rescale in flight may be admitting it: then the
//!   commit decides (admitted, it is an at-risk member; not, it is cancelled),
//!   so a process is never stopped at the moment it becomes a member. A
//!   cancelled name is never admitted.
//!
//! One rescale is in flight at a time: after a [`Decision::Rescale`], the
//! driver reports [`Event::RescaleCommitted`] or [`Event::RescaleFailed`].
//! Newcomers are named by the policy (`{prefix}{n}`), so a driver can create
//! a pod or process with that name and report it back.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use crate::crd::{ElasticJobSpec, RebalanceMode};

/// Virtual time: the time since an origin the driver chooses (the policy
/// has no clock of its own).
pub type Time = Duration;

/// A node of the job (a pod, or a process on the local fleet), by name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberId(pub String);

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for MemberId {
    fn from(name: &str) -> Self {
        MemberId(name.to_owned())
    }
}

/// What kind of capacity a member runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capacity {
    /// On-demand: never removed by the policy.
    OnDemand,
    /// Spot: may be at risk, replaced, or removed to shrink.
    Spot,
}

/// The policy's settings, usually from an ElasticJob spec ([`PolicyConfig::from_spec`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    /// Complete replacement or immediate.
    pub mode: RebalanceMode,
    /// Time after the oldest rebalance recommendation at which the job
    /// rescales with what is ready (also the longest a ready newcomer waits
    /// for the others of a scale-up).
    pub rebalance_timeout: Duration,
    /// An interruption notice forces a rescale at once.
    pub emergency_on_interruption: bool,
    /// A member that must go is removed even without a ready replacement.
    pub shrink_when_no_replacement: bool,
    /// Deadline of an interruption notice that does not carry one.
    pub interruption_deadline: Duration,
    /// Time a removal needs before the deadline (evacuation, commit).
    pub evacuation_margin: Duration,
    /// Wait after a failed rescale before requesting another.
    pub retry_after: Duration,
    /// Fewest members (voluntary removals never go below).
    pub min_replicas: u32,
    /// Most members; `None`: unbounded.
    pub max_replicas: Option<u32>,
    /// Prefix of the names the policy gives newcomers.
    pub newcomer_prefix: String,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            mode: RebalanceMode::CompleteReplacement,
            rebalance_timeout: Duration::from_secs(120),
            emergency_on_interruption: true,
            shrink_when_no_replacement: true,
            interruption_deadline: Duration::from_secs(120),
            evacuation_margin: Duration::from_secs(30),
            retry_after: Duration::from_secs(10),
            min_replicas: 1,
            max_replicas: None,
            newcomer_prefix: "newcomer-".to_owned(),
        }
    }
}

fn non_negative(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

impl PolicyConfig {
    /// The policy settings of an ElasticJob (defaults filled in); newcomers
    /// are named `{job}-n{k}`.
    pub fn from_spec(job: &str, spec: &ElasticJobSpec) -> Self {
        let policy = spec.rescale_policy();
        PolicyConfig {
            mode: policy.rebalance.mode,
            rebalance_timeout: Duration::from_secs(
                non_negative(policy.rebalance.timeout_seconds).into(),
            ),
            emergency_on_interruption: policy.emergency_on_interruption,
            shrink_when_no_replacement: policy.shrink_when_no_replacement,
            interruption_deadline: Duration::from_secs(
                non_negative(policy.interruption_deadline_seconds).into(),
            ),
            min_replicas: non_negative(spec.min_replicas).max(1),
            max_replicas: spec.max_replicas.map(non_negative),
            newcomer_prefix: format!("{job}-n"),
            ..PolicyConfig::default()
        }
    }

    /// `desired` clamped to `[min, max]`.
    pub fn clamp(&self, desired: u32) -> u32 {
        let upper = self.max_replicas.unwrap_or(u32::MAX).max(self.min_replicas);
        desired.clamp(self.min_replicas, upper)
    }
}

/// Something that happened, as seen by the driver.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A launch member is part of the job's view (at launch, epoch 1).
    MemberJoined {
        /// The member.
        member: MemberId,
        /// Where it runs.
        capacity: Capacity,
        /// It is node 0 (PE 0).
        root: bool,
    },
    /// A newcomer registered with the coordinator and waits to be admitted.
    NewcomerReady {
        /// The newcomer.
        newcomer: MemberId,
    },
    /// The member's instance got a rebalance recommendation (elevated risk).
    RebalanceRecommendation {
        /// The member.
        member: MemberId,
    },
    /// The member's instance will be interrupted.
    InterruptionNotice {
        /// The member.
        member: MemberId,
        /// When the instance goes away; `None`: now + the configured deadline.
        deadline: Option<Time>,
    },
    /// A member, newcomer or launch is gone: it left after a rescale removed
    /// it, or its pod or process vanished.
    MemberGone {
        /// The member or newcomer.
        member: MemberId,
    },
    /// The desired number of members changed (`kubectl scale`, an HPA).
    DesiredReplicas {
        /// The new desired count (clamped to `[min, max]`).
        replicas: u32,
    },
    /// The requested rescale committed.
    RescaleCommitted {
        /// The new epoch.
        epoch: u64,
        /// Newcomers admitted (the coordinator admits `min(admit, pending)`).
        admitted: Vec<MemberId>,
    },
    /// The requested rescale failed; nothing changed.
    RescaleFailed {
        /// Why.
        reason: String,
    },
}

/// Why a rescale is requested.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RescaleReason {
    /// Every at-risk member has a ready replacement.
    CompleteReplacement,
    /// An interruption notice: rescale now with what is ready.
    Emergency,
    /// The rebalance timeout expired: rescale with what is ready.
    Timeout,
    /// Mode `Immediate`: a replacement is ready.
    Immediate,
    /// An interrupted member reached its deadline (minus the evacuation margin).
    Deadline,
    /// The job grows towards its desired size.
    ScaleUp,
    /// The job shrinks towards its desired size.
    ScaleDown,
}

impl fmt::Display for RescaleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Something the driver should know (and record as an Event / log line).
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    /// A notice for node 0's or an on-demand member's instance: never chosen
    /// for removal.
    ProtectedMemberAtRisk {
        /// The member.
        member: MemberId,
        /// It is node 0.
        root: bool,
    },
    /// An interrupted member has no replacement and shrinking is disabled:
    /// it will be lost at its deadline.
    NoReplacementByDeadline {
        /// The member.
        member: MemberId,
    },
    /// A forced removal (interruption) takes the job below `minReplicas`.
    BelowMinReplicas {
        /// Members after the rescale.
        members: u32,
        /// `minReplicas`.
        min: u32,
    },
    /// A member vanished without a rescale removing it.
    MemberLost {
        /// The member.
        member: MemberId,
    },
    /// The desired size was outside `[min, max]`.
    DesiredClamped {
        /// As requested.
        requested: u32,
        /// As used.
        target: u32,
    },
    /// A rescale failed; another is tried after the retry delay.
    RescaleFailed {
        /// Why.
        reason: String,
    },
}

/// What the driver should do.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Launch a newcomer to replace an at-risk member.
    LaunchReplacement {
        /// The at-risk member.
        for_member: MemberId,
        /// Name of the newcomer to launch.
        newcomer: MemberId,
    },
    /// Launch newcomers to grow the job.
    LaunchNewcomers {
        /// Names of the newcomers to launch.
        newcomers: Vec<MemberId>,
    },
    /// Ask PE 0 to rescale: remove these members, admit this many newcomers.
    Rescale {
        /// Members to remove (never node 0 nor an on-demand member).
        remove: Vec<MemberId>,
        /// Newcomers to admit.
        admit: u32,
        /// Why.
        reason: RescaleReason,
    },
    /// Stop these newcomers (delete their pods / processes): they will not
    /// be admitted.
    CancelNewcomers {
        /// The newcomers.
        newcomers: Vec<MemberId>,
        /// Why.
        reason: CancelReason,
    },
    /// A removed member left the job: delete its pod / reap its process.
    DeleteVacated {
        /// The member.
        member: MemberId,
    },
    /// Tell the user.
    Report(Report),
}

/// Why newcomers are cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    /// More newcomers than the (lowered) target needs.
    Surplus,
    /// The newcomer's own instance got a rebalance recommendation or an
    /// interruption notice.
    AtRisk,
}

impl fmt::Display for CancelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CancelReason::Surplus => "more newcomers than the job needs",
            CancelReason::AtRisk => "its instance got a notice",
        })
    }
}

#[derive(Clone, Debug)]
struct Member {
    capacity: Capacity,
    root: bool,
    /// First rebalance recommendation or notice.
    at_risk_since: Option<Time>,
    /// Interruption deadline.
    deadline: Option<Time>,
    /// The newcomer launched to replace it (cleared when that one is cancelled).
    replacement: Option<MemberId>,
    /// Reported as lost-at-deadline already.
    reported_unreplaced: bool,
}

impl Member {
    fn protected(&self) -> bool {
        self.root || self.capacity == Capacity::OnDemand
    }
}

#[derive(Clone, Debug)]
struct InFlight {
    remove: Vec<MemberId>,
}

/// The rescale policy of one job. Feed it [`Event`]s with
/// [`observe`](Policy::observe), ask [`decide`](Policy::decide) what to do,
/// and call `decide` again at [`next_wakeup`](Policy::next_wakeup).
#[derive(Clone, Debug)]
pub struct Policy {
    config: PolicyConfig,
    target: u32,
    members: BTreeMap<MemberId, Member>,
    /// Newcomers launched, not yet registered.
    launching: BTreeSet<MemberId>,
    /// Newcomers registered, waiting for admission, with the time they got ready.
    ready: BTreeMap<MemberId, Time>,
    /// Members removed by a committed rescale, not yet gone.
    vacating: BTreeSet<MemberId>,
    /// Newcomers cancelled: never taken back into the pool.
    cancelled: BTreeSet<MemberId>,
    /// Waiting newcomers whose instance got a recommendation or notice while
    /// a rescale that may admit them was in flight: (first warning,
    /// deadline). Cancelling one then could stop a process at the moment
    /// the commit makes it a member, so the commit decides: admitted, it is
    /// an at-risk member like any other; not admitted, it is cancelled.
    at_risk_waiting: BTreeMap<MemberId, (Time, Option<Time>)>,
    in_flight: Option<InFlight>,
    /// The rebalance timeout expired and no at-risk member was left since.
    timeout_expired: bool,
    retry_at: Option<Time>,
    next_newcomer: u64,
    reports: Vec<Report>,
    decisions: Vec<Decision>,
}

impl Policy {
    /// A policy for a job that wants `desired` members.
    pub fn new(config: PolicyConfig, desired: u32) -> Self {
        let target = config.clamp(desired);
        Policy {
            config,
            target,
            members: BTreeMap::new(),
            launching: BTreeSet::new(),
            ready: BTreeMap::new(),
            vacating: BTreeSet::new(),
            cancelled: BTreeSet::new(),
            at_risk_waiting: BTreeMap::new(),
            in_flight: None,
            timeout_expired: false,
            retry_at: None,
            next_newcomer: 0,
            reports: Vec::new(),
            decisions: Vec::new(),
        }
    }

    /// The desired size, clamped to `[min, max]`.
    pub fn target(&self) -> u32 {
        self.target
    }

    /// The settings in force.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Takes new settings while the job runs (its spec's `minReplicas`,
    /// `maxReplicas` or `rescalePolicy` changed): the next
    /// [`decide`](Policy::decide) follows them. `desired` (the job's
    /// `replicas`) is clamped to the new bounds, reported when it does not
    /// fit. What is under way stays: the rescale in flight, newcomers'
    /// names (the prefix is kept), and the deadlines of notices already
    /// seen (a changed `interruption_deadline` applies to later notices).
    pub fn reconfigure(&mut self, config: PolicyConfig, desired: u32) {
        let prefix = std::mem::take(&mut self.config.newcomer_prefix);
        tracing::info!(old = ?self.config, new = ?config, "policy reconfigured");
        self.config = PolicyConfig {
            newcomer_prefix: prefix,
            ..config
        };
        let target = self.config.clamp(desired);
        if target != desired {
            self.reports.push(Report::DesiredClamped {
                requested: desired,
                target,
            });
        }
        self.target = target;
    }

    /// Members of the current view.
    pub fn members(&self) -> impl Iterator<Item = &MemberId> {
        self.members.keys()
    }

    /// Members of the current view whose instance is at risk.
    pub fn at_risk(&self) -> Vec<MemberId> {
        self.members
            .iter()
            .filter(|(_, m)| m.at_risk_since.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Newcomers registered and waiting for admission.
    pub fn pending_newcomers(&self) -> usize {
        self.ready.len()
    }

    /// Whether a rescale is in flight.
    pub fn rescale_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Makes the names of future newcomers differ from `taken` (the pods or
    /// processes that exist already, when a driver restarts and builds a new
    /// policy for a running job).
    pub fn reserve_names<'a>(&mut self, taken: impl IntoIterator<Item = &'a str>) {
        for name in taken {
            let number = name
                .strip_prefix(&self.config.newcomer_prefix)
                .and_then(|k| k.parse::<u64>().ok());
            if let Some(k) = number {
                self.next_newcomer = self.next_newcomer.max(k + 1);
            }
        }
    }

    /// Feeds one event that happened at `now`.
    pub fn observe(&mut self, now: Time, event: Event) {
        tracing::debug!(?now, ?event, "policy event");
        match event {
            Event::MemberJoined {
                member,
                capacity,
                root,
            } => {
                self.launching.remove(&member);
                self.ready.remove(&member);
                self.members.insert(
                    member,
                    Member {
                        capacity,
                        root,
                        at_risk_since: None,
                        deadline: None,
                        replacement: None,
                        reported_unreplaced: false,
                    },
                );
            }
            Event::NewcomerReady { newcomer } => {
                if !self.members.contains_key(&newcomer) && !self.cancelled.contains(&newcomer) {
                    self.launching.remove(&newcomer);
                    self.ready.entry(newcomer).or_insert(now);
                }
            }
            Event::RebalanceRecommendation { member } => self.mark_at_risk(now, &member, None),
            Event::InterruptionNotice { member, deadline } => {
                let deadline = deadline.unwrap_or(now + self.config.interruption_deadline);
                self.mark_at_risk(now, &member, Some(deadline));
            }
            Event::MemberGone { member } => {
                if self.vacating.remove(&member) {
                    self.decisions.push(Decision::DeleteVacated { member });
                } else if self.members.remove(&member).is_some() {
                    tracing::warn!(%member, "member lost without a rescale");
                    self.reports.push(Report::MemberLost {
                        member: member.clone(),
                    });
                    self.decisions.push(Decision::DeleteVacated { member });
                } else {
                    self.launching.remove(&member);
                    self.ready.remove(&member);
                    self.at_risk_waiting.remove(&member);
                }
            }
            Event::DesiredReplicas { replicas } => {
                let target = self.config.clamp(replicas);
                if target != replicas {
                    self.reports.push(Report::DesiredClamped {
                        requested: replicas,
                        target,
                    });
                }
                self.target = target;
            }
            Event::RescaleCommitted { epoch, admitted } => {
                let Some(flight) = self.in_flight.take() else {
                    tracing::warn!(epoch, "commit reported with no rescale in flight");
                    return;
                };
                tracing::info!(
                    epoch,
                    removed = flight.remove.len(),
                    admitted = admitted.len(),
                    "rescale committed"
                );
                for member in flight.remove {
                    if self.members.remove(&member).is_some() {
                        self.vacating.insert(member);
                    }
                }
                for newcomer in admitted {
                    self.ready.remove(&newcomer);
                    self.launching.remove(&newcomer);
                    let (at_risk_since, deadline) = self
                        .at_risk_waiting
                        .remove(&newcomer)
                        .map_or((None, None), |(since, deadline)| (Some(since), deadline));
                    self.members.insert(
                        newcomer,
                        Member {
                            capacity: Capacity::Spot,
                            root: false,
                            at_risk_since,
                            deadline,
                            replacement: None,
                            reported_unreplaced: false,
                        },
                    );
                }
                self.cancel_at_risk_waiting();
                if !self
                    .members
                    .values()
                    .any(|m| m.at_risk_since.is_some() && !m.protected())
                {
                    self.timeout_expired = false;
                }
            }
            Event::RescaleFailed { reason } => {
                tracing::warn!(%reason, "rescale failed");
                self.in_flight = None;
                self.retry_at = Some(now + self.config.retry_after);
                self.cancel_at_risk_waiting();
                self.reports.push(Report::RescaleFailed { reason });
            }
        }
    }

    fn mark_at_risk(&mut self, now: Time, member: &MemberId, deadline: Option<Time>) {
        let Some(state) = self.members.get_mut(member) else {
            if self.in_flight.is_some() && self.ready.contains_key(member) {
                // The rescale in flight may admit it: its commit decides.
                let (_, waiting_deadline) =
                    self.at_risk_waiting.entry(member.clone()).or_insert((now, None));
                if let Some(deadline) = deadline {
                    *waiting_deadline = Some(waiting_deadline.map_or(deadline, |d| d.min(deadline)));
                }
                return;
            }
            // A newcomer at risk before admission: it is not worth admitting.
            if self.ready.remove(member).is_some() || self.launching.remove(member) {
                tracing::info!(%member, "newcomer at risk, cancelled");
                self.forget_newcomer(member);
                self.decisions.push(Decision::CancelNewcomers {
                    newcomers: vec![member.clone()],
                    reason: CancelReason::AtRisk,
                });
            }
            return;
        };
        let first = state.at_risk_since.is_none();
        state.at_risk_since.get_or_insert(now);
        if let Some(deadline) = deadline {
            state.deadline = Some(state.deadline.map_or(deadline, |d| d.min(deadline)));
        }
        if state.protected() && first {
            tracing::warn!(%member, root = state.root, "notice for a protected member: it is never removed");
            self.reports.push(Report::ProtectedMemberAtRisk {
                member: member.clone(),
                root: state.root,
            });
        }
    }

    /// At-risk members that may be removed, most urgent first: the earliest
    /// deadline, then the oldest recommendation.
    fn removable_at_risk(&self) -> Vec<MemberId> {
        let mut list: Vec<(&MemberId, &Member)> = self
            .members
            .iter()
            .filter(|(_, m)| m.at_risk_since.is_some() && !m.protected())
            .collect();
        list.sort_by_key(|(id, m)| {
            (
                m.deadline.is_none(),
                m.deadline,
                m.at_risk_since,
                (*id).clone(),
            )
        });
        list.into_iter().map(|(id, _)| id.clone()).collect()
    }

    fn act_by(&self, member: &Member) -> Option<Time> {
        member
            .deadline
            .map(|d| d.saturating_sub(self.config.evacuation_margin))
    }

    fn new_name(&mut self) -> MemberId {
        let name = format!("{}{}", self.config.newcomer_prefix, self.next_newcomer);
        self.next_newcomer += 1;
        MemberId(name)
    }

    /// What to do at `now`: launches, at most one rescale, deletions, reports.
    pub fn decide(&mut self, now: Time) -> Vec<Decision> {
        let mut out = std::mem::take(&mut self.decisions);
        out.extend(self.reports.drain(..).map(Decision::Report));
        self.plan_launches(&mut out);
        if self.in_flight.is_none() && self.retry_at.is_none_or(|t| now >= t) {
            self.retry_at = None;
            if let Some((remove, admit, reason)) = self.plan_rescale(now, &mut out) {
                tracing::info!(?remove, admit, %reason, "rescale requested");
                self.in_flight = Some(InFlight {
                    remove: remove.clone(),
                });
                out.push(Decision::Rescale {
                    remove,
                    admit,
                    reason,
                });
            }
        }
        out
    }

    /// Launches so that, once every at-risk member has left, the job can
    /// still reach its target: one replacement per at-risk member, named
    /// after it, and plain newcomers for growth.
    fn plan_launches(&mut self, out: &mut Vec<Decision>) {
        let at_risk = self.removable_at_risk();
        let staying = self.members.len() - at_risk.len();
        let needed = (self.target as usize).saturating_sub(staying);
        let have = self.ready.len() + self.launching.len();
        if have > needed {
            self.cancel_surplus(have - needed, out);
        }
        let mut missing = needed.saturating_sub(have);
        // Credit launches already made for at-risk members first, so each gets one.
        for member in &at_risk {
            if missing == 0 {
                break;
            }
            if self.members[member].replacement.is_some() {
                continue;
            }
            let newcomer = self.new_name();
            self.launching.insert(newcomer.clone());
            if let Some(state) = self.members.get_mut(member) {
                state.replacement = Some(newcomer.clone());
            }
            out.push(Decision::LaunchReplacement {
                for_member: member.clone(),
                newcomer,
            });
            missing -= 1;
        }
        if missing > 0 {
            let newcomers: Vec<MemberId> = (0..missing).map(|_| self.new_name()).collect();
            self.launching.extend(newcomers.iter().cloned());
            out.push(Decision::LaunchNewcomers { newcomers });
        }
    }

    /// Cancels the waiting newcomers that got a warning during the rescale
    /// that has just ended without admitting them.
    fn cancel_at_risk_waiting(&mut self) {
        let waiting = std::mem::take(&mut self.at_risk_waiting);
        let newcomers: Vec<MemberId> = waiting
            .into_keys()
            .filter(|n| self.ready.contains_key(n))
            .collect();
        if newcomers.is_empty() {
            return;
        }
        for newcomer in &newcomers {
            tracing::info!(%newcomer, "newcomer at risk, not admitted: cancelled");
            self.forget_newcomer(newcomer);
        }
        self.decisions.push(Decision::CancelNewcomers {
            newcomers,
            reason: CancelReason::AtRisk,
        });
    }

    /// Takes a cancelled newcomer out of the pool for good; the member it
    /// was to replace may get another replacement.
    fn forget_newcomer(&mut self, newcomer: &MemberId) {
        self.launching.remove(newcomer);
        self.ready.remove(newcomer);
        self.cancelled.insert(newcomer.clone());
        for state in self.members.values_mut() {
            if state.replacement.as_ref() == Some(newcomer) {
                state.replacement = None;
            }
        }
    }

    /// Cancels `surplus` newcomers: those not yet registered first, then
    /// the waiting ones (never while a rescale that may admit them is in
    /// flight), the newest first.
    fn cancel_surplus(&mut self, surplus: usize, out: &mut Vec<Decision>) {
        let newest_first = |set: Vec<MemberId>| {
            let mut list = set;
            list.sort_by_key(|m| std::cmp::Reverse(natural_key(m)));
            list
        };
        let mut candidates = newest_first(self.launching.iter().cloned().collect());
        if self.in_flight.is_none() {
            candidates.extend(newest_first(self.ready.keys().cloned().collect()));
        }
        let cancel: Vec<MemberId> = candidates.into_iter().take(surplus).collect();
        if cancel.is_empty() {
            return;
        }
        for newcomer in &cancel {
            self.forget_newcomer(newcomer);
        }
        tracing::info!(?cancel, "surplus newcomers cancelled");
        out.push(Decision::CancelNewcomers {
            newcomers: cancel,
            reason: CancelReason::Surplus,
        });
    }

    fn plan_rescale(
        &mut self,
        now: Time,
        out: &mut Vec<Decision>,
    ) -> Option<(Vec<MemberId>, u32, RescaleReason)> {
        let at_risk = self.removable_at_risk();
        let members = self.members.len();
        let pending = self.ready.len();
        let target = self.target as usize;

        let (mut remove, reason) = if !at_risk.is_empty() {
            let must_go: Vec<MemberId> = at_risk
                .iter()
                .filter(|id| {
                    let m = &self.members[*id];
                    m.deadline.is_some()
                        && (self.config.emergency_on_interruption
                            || self.act_by(m).is_some_and(|t| now >= t))
                })
                .cloned()
                .collect();
            let oldest = at_risk
                .iter()
                .filter_map(|id| self.members[id].at_risk_since)
                .min()
                .expect("at-risk members have a time");
            if now >= oldest + self.config.rebalance_timeout {
                self.timeout_expired = true;
            }
            if !must_go.is_empty() {
                let reason = if self.config.emergency_on_interruption {
                    RescaleReason::Emergency
                } else {
                    RescaleReason::Deadline
                };
                let mut forced = Vec::new();
                let mut spare = pending;
                for member in must_go {
                    if spare > 0 {
                        spare -= 1;
                        forced.push(member);
                    } else if self.config.shrink_when_no_replacement {
                        forced.push(member);
                    } else if let Some(state) = self.members.get_mut(&member) {
                        if !state.reported_unreplaced {
                            state.reported_unreplaced = true;
                            out.push(Decision::Report(Report::NoReplacementByDeadline { member }));
                        }
                    }
                }
                // Replacements left over replace further at-risk members.
                for member in &at_risk {
                    if spare == 0 {
                        break;
                    }
                    if !forced.contains(member) && self.members[member].deadline.is_none() {
                        forced.push(member.clone());
                        spare -= 1;
                    }
                }
                (forced, Some(reason))
            } else if self.config.mode == RebalanceMode::Immediate || self.timeout_expired {
                let reason = if self.config.mode == RebalanceMode::Immediate {
                    RescaleReason::Immediate
                } else {
                    RescaleReason::Timeout
                };
                (
                    at_risk.iter().take(pending).cloned().collect(),
                    Some(reason),
                )
            } else if pending >= at_risk.len() {
                (at_risk.clone(), Some(RescaleReason::CompleteReplacement))
            } else {
                (Vec::new(), None)
            }
        } else {
            (Vec::new(), None)
        };

        if let Some(reason) = reason {
            if !remove.is_empty() {
                let staying = members - remove.len();
                let admit = pending.min(target.saturating_sub(staying));
                let after = staying + admit;
                let min = self.config.min_replicas as usize;
                if after < min {
                    out.push(Decision::Report(Report::BelowMinReplicas {
                        members: after as u32,
                        min: min as u32,
                    }));
                }
                return Some((remove, admit as u32, reason));
            }
        }

        // No replacement due: move towards the target size.
        if members > target {
            let surplus = members - target;
            let mut candidates: Vec<MemberId> = at_risk.clone();
            // Newest spot members next (names sort by launch order within a prefix).
            let mut spot: Vec<&MemberId> = self
                .members
                .iter()
                .filter(|(id, m)| !m.protected() && !candidates.contains(id))
                .map(|(id, _)| id)
                .collect();
            spot.sort_by_key(|m| std::cmp::Reverse(natural_key(m)));
            candidates.extend(spot.into_iter().cloned());
            remove = candidates.into_iter().take(surplus).collect();
            if !remove.is_empty() {
                return Some((remove, 0, RescaleReason::ScaleDown));
            }
        } else if members < target && pending > 0 {
            let wanted = target - members;
            let oldest_ready = self.ready.values().min().copied().unwrap_or(now);
            let grow_now = pending >= wanted
                || self.config.mode == RebalanceMode::Immediate
                || now >= oldest_ready + self.config.rebalance_timeout;
            if grow_now {
                return Some((
                    Vec::new(),
                    pending.min(wanted) as u32,
                    RescaleReason::ScaleUp,
                ));
            }
        }
        None
    }

    /// The next time after `now` at which [`decide`](Policy::decide) may act
    /// without a new event (a timeout, a deadline, a growth wait, a retry).
    pub fn next_wakeup(&self, now: Time) -> Option<Time> {
        if self.in_flight.is_some() {
            return None;
        }
        let mut times = Vec::new();
        for m in self.members.values().filter(|m| !m.protected()) {
            if let Some(since) = m.at_risk_since {
                if !self.timeout_expired {
                    times.push(since + self.config.rebalance_timeout);
                }
            }
            if let Some(t) = self.act_by(m) {
                times.push(t);
            }
        }
        if let Some(ready) = self.ready.values().min() {
            times.push(*ready + self.config.rebalance_timeout);
        }
        // While a failed rescale backs off, nothing happens before the retry.
        let retry = self.retry_at.unwrap_or(Duration::ZERO);
        let mut next: Option<Time> = self.retry_at.filter(|t| *t > now);
        for t in times.into_iter().map(|t| t.max(retry)).filter(|t| *t > now) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        next
    }
}

/// Sort key that orders `name-10` after `name-9`.
fn natural_key(id: &MemberId) -> (String, u64) {
    let digits = id.0.len() - id.0.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, number) = id.0.split_at(id.0.len() - digits);
    (stem.to_owned(), number.parse().unwrap_or(0))
}

#[cfg(test)]
mod tests;
