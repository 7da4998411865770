//! The pods of one job as a reconcile sees them (read from the
//! controllers' pod cache, never listed from the API server), and the
//! calls that create and delete them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};

use super::error::*;
use super::notices::{self, PodState};
use super::objects;
use super::MANAGER;
use crate::crd::ElasticJob;

/// The jobs' pods as the controllers' reflectors keep them (label
/// `ductile.dev/job`): one store per watched namespace, or one for every
/// namespace. A reconcile reads its job's pods here instead of listing
/// them; the watch behind each store also wakes the pods' owner job.
///
/// The cache may lag the API server by one watch event: a pod created by
/// the last reconcile may be missing (creating it again is a server-side
/// apply of the same object: a no-op), a deleted one may still show
/// (deleting it again finds it gone).
#[derive(Clone, Default)]
pub struct PodCache {
    stores: Vec<(Option<String>, Store<Pod>)>,
    /// Longest wait for a store's first list (the operator's start).
    ready_timeout: Duration,
}

impl PodCache {
    /// A cache over `stores`: `(Some(namespace), store)` for a store of
    /// that namespace's pods, `(None, store)` for one of every namespace.
    pub fn new(stores: Vec<(Option<String>, Store<Pod>)>) -> Self {
        PodCache {
            stores,
            ready_timeout: Duration::from_secs(30),
        }
    }

    /// The same cache with another wait for a store's first list.
    pub fn with_ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// The pods of `job`, once the store of its namespace has its first list.
    pub(super) async fn pods_of(&self, job: &ElasticJob) -> Result<Vec<Pod>> {
        let namespace = job.namespace().unwrap_or_default();
        let store = self
            .stores
            .iter()
            .find(|(ns, _)| ns.as_deref() == Some(namespace.as_str()))
            .or_else(|| self.stores.iter().find(|(ns, _)| ns.is_none()))
            .map(|(_, store)| store)
            .ok_or_else(|| Error::PodCache(format!("none covers namespace {namespace}")))?;
        match tokio::time::timeout(self.ready_timeout, store.wait_until_ready()).await {
            Ok(Ok(())) => {}
            Ok(Err(dropped)) => return Err(Error::PodCache(dropped.to_string())),
            Err(_) => {
                return Err(Error::PodCache(format!(
                    "the pods of namespace {namespace} were not listed within {} s",
                    self.ready_timeout.as_secs()
                )))
            }
        }
        let name = job.name_any();
        Ok(store
            .state()
            .into_iter()
            .filter(|pod| {
                pod.namespace().as_deref() == Some(namespace.as_str())
                    && pod.labels().get(objects::JOB_LABEL) == Some(&name)
            })
            .map(|pod| (*pod).clone())
            .collect())
    }
}

/// What the pods of a job look like in one reconcile.
pub(super) struct PodView {
    pub(super) by_name: BTreeMap<String, Pod>,
    /// Pods deleted in this reconcile.
    pub(super) deleted: BTreeSet<String>,
}

impl PodView {
    pub(super) fn alive(&self) -> usize {
        self.by_name
            .iter()
            .filter(|(name, pod)| {
                !self.deleted.contains(*name)
                    && !matches!(
                        notices::pod_state(pod),
                        PodState::Succeeded | PodState::Failed
                    )
            })
            .count()
    }
}

/// The pods the scheduler could not place, with its message (`kubectl
/// describe pod` shows the same): "jacobi-2: 0/5 nodes are available: ...".
/// `None` when every live pod is scheduled or merely not yet looked at.
pub(super) fn unschedulable(view: &PodView) -> Option<String> {
    let lines: Vec<String> = view
        .by_name
        .iter()
        .filter(|(name, pod)| {
            !view.deleted.contains(*name) && notices::pod_state(pod) == PodState::Pending
        })
        .filter_map(|(name, pod)| {
            let scheduled = pod
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (scheduled.status == "False" && scheduled.reason.as_deref() == Some("Unschedulable"))
                .then(|| format!("{name}: {}", scheduled.message.as_deref().unwrap_or("no message")))
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// Pods of a run that is over (being deleted, or ended), with whether each
/// is being deleted already.
pub(super) fn leftover_pods(view: &PodView) -> Vec<(String, bool)> {
    view.by_name
        .iter()
        .filter_map(|(name, pod)| {
            let deleting = pod.metadata.deletion_timestamp.is_some();
            let ended = matches!(
                notices::pod_state(pod),
                PodState::Succeeded | PodState::Failed
            );
            (deleting || ended).then(|| (name.clone(), deleting))
        })
        .collect()
}

/// Deletes every pod of the job (one call, by label).
pub(super) async fn delete_job_pods(job: &ElasticJob, pods: &Api<Pod>) -> Result<()> {
    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&objects::selector(job)),
    )
    .await?;
    Ok(())
}

/// Deletes a pod; one already gone is fine.
pub(super) async fn delete_pod(pods: &Api<Pod>, name: &str) -> Result<()> {
    match pods.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Creates a pod by server-side apply with the operator's field manager,
/// like every object it writes. Not forced: a pod of that name whose fields
/// another manager owns is [`Error::NotOwned`], never taken over; the same
/// pod applied again (a lagging cache, a lost answer) changes nothing.
pub(super) async fn apply_pod(pods: &Api<Pod>, pod: &Pod) -> Result<Pod> {
    let name = pod.name_any();
    match pods
        .patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(pod))
        .await
    {
        Ok(pod) => Ok(pod),
        Err(kube::Error::Api(e)) if e.code == 409 => Err(Error::NotOwned {
            object: format!("Pod/{name}"),
            message: e.message,
        }),
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn create_newcomer(
    job: &ElasticJob,
    pods: &Api<Pod>,
    view: &mut PodView,
    name: &str,
    replaces: Option<&str>,
) -> Result<()> {
    let pod = apply_pod(pods, &objects::newcomer_pod(job, name, replaces)).await?;
    view.by_name.insert(name.to_owned(), pod);
    tracing::info!(job = %job.name_any(), newcomer = name, ?replaces, "newcomer pod created");
    Ok(())
}
