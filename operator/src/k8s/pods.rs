//! The pods of one job as a reconcile sees them, and the calls that
//! create and delete them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};

use super::error::*;
use super::notices::{self, PodState};
use super::objects;
use crate::crd::ElasticJob;

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

pub(super) async fn create_newcomer(
    job: &ElasticJob,
    pods: &Api<Pod>,
    view: &mut PodView,
    name: &str,
    replaces: Option<&str>,
) -> Result<()> {
    match pods
        .create(
            &PostParams::default(),
            &objects::newcomer_pod(job, name, replaces),
        )
        .await
    {
        Ok(pod) => {
            view.by_name.insert(name.to_owned(), pod);
        }
        // Created by a reconcile whose answer was lost: it is the same pod.
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    tracing::info!(job = %job.name_any(), newcomer = name, ?replaces, "newcomer pod created");
    Ok(())
}
