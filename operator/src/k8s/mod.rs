//! The Kubernetes fleet: a kube-runtime `Controller` that reconciles
//! ElasticJobs into the objects of [`objects`].
//!
//! This is a skeleton. What it does today, per reconcile: check the spec
//! (an invalid one is reported in the `SpecValid` condition and nothing else
//! changes); create the job Secret when `spec.secretRef` is absent and it does
//! not exist; server-side apply the headless Service; create the launch pods
//! that are missing; write `status` (phase, replicas, selector, conditions)
//! by server-side apply. Not yet: the finalizer, node-taint watching,
//! feeding [`crate::policy`] and carrying out its decisions (that needs PE
//! 0's control endpoint), Events, leader election, metrics.

pub mod objects;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::crd::{ElasticJob, ElasticJobStatus, Phase};
use objects::ObjectSettings;

/// Field manager of every server-side apply the operator makes.
pub const MANAGER: &str = "ductile-operator";

/// What can go wrong in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The ElasticJob has no namespace (it is a namespaced resource).
    #[error("ElasticJob {0} has no namespace")]
    NoNamespace(String),
}

/// Result of the reconciler's operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shared state of the reconciler.
#[derive(Clone)]
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Settings the objects depend on.
    pub settings: ObjectSettings,
}

fn condition(job: &ElasticJob, type_: &str, ok: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: job.metadata.generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

async fn patch_status(
    jobs: &Api<ElasticJob>,
    job: &ElasticJob,
    status: ElasticJobStatus,
) -> Result<()> {
    let patch = json!({
        "apiVersion": "ductile.dev/v1alpha1",
        "kind": "ElasticJob",
        "status": status,
    });
    jobs.patch_status(
        &job.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// One reconcile of one ElasticJob (see the module docs for what it does).
pub async fn reconcile(job: Arc<ElasticJob>, ctx: Arc<Context>) -> Result<Action> {
    let name = job.name_any();
    let ns = job
        .namespace()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    let client = ctx.client.clone();
    let jobs: Api<ElasticJob> = Api::namespaced(client.clone(), &ns);
    let old = job.status.clone().unwrap_or_default();

    if let Err(invalid) = job.spec.validate() {
        tracing::warn!(job = %name, %invalid, "invalid spec: nothing changed");
        let status = ElasticJobStatus {
            observed_generation: job.metadata.generation,
            conditions: vec![condition(
                &job,
                "SpecValid",
                false,
                "InvalidSpec",
                invalid.to_string(),
            )],
            ..old
        };
        patch_status(&jobs, &job, status).await?;
        return Ok(Action::await_change());
    }
    if objects::is_deleting(&job) {
        // Owner references garbage-collect the pods; the finalizer comes later.
        return Ok(Action::await_change());
    }

    if job.spec.secret_ref.is_none() {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        let secret_name = objects::secret_name(&job);
        if secrets.get_opt(&secret_name).await?.is_none() {
            let hex = ductile_coordinator::Secret::generate().to_hex();
            secrets
                .create(&PostParams::default(), &objects::job_secret(&job, &hex))
                .await?;
            tracing::info!(job = %name, secret = %secret_name, "job secret created");
        }
    }

    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    services
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&objects::headless_service(&job)),
        )
        .await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let existing = pods
        .list(&ListParams::default().labels(&objects::selector(&job)))
        .await?;
    let existing: Vec<String> = existing.items.iter().map(|p| p.name_any()).collect();
    let replicas = u32::try_from(job.spec.replicas).unwrap_or(0);
    let mut created = 0;
    if old.epoch.is_none() {
        // Before epoch 1 the launch members are the pods 0..replicas; after
        // it, growth goes through newcomers (the policy), not here.
        for index in 0..replicas {
            let pod_name = objects::pod_name(&job, index);
            if !existing.contains(&pod_name) {
                pods.create(
                    &PostParams::default(),
                    &objects::launch_pod(&job, index, &ctx.settings),
                )
                .await?;
                created += 1;
            }
        }
    }
    tracing::info!(job = %name, created, "launch pods reconciled");

    let status = ElasticJobStatus {
        phase: Some(old.phase.unwrap_or(Phase::Launching)),
        observed_generation: job.metadata.generation,
        replicas: i32::try_from(existing.len() + created).unwrap_or(i32::MAX),
        selector: Some(objects::selector(&job)),
        conditions: vec![condition(&job, "SpecValid", true, "Valid", String::new())],
        ..old
    };
    patch_status(&jobs, &job, status).await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Requeue after a failed reconcile.
pub fn error_policy(job: Arc<ElasticJob>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(job = %job.name_any(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(15))
}

/// Runs the controller until SIGINT/SIGTERM.
pub async fn run(client: Client, settings: ObjectSettings) {
    let jobs = Api::<ElasticJob>::all(client.clone());
    let owned = watcher::Config::default().labels(objects::JOB_LABEL);
    let ctx = Arc::new(Context {
        client: client.clone(),
        settings,
    });
    Controller::new(jobs, watcher::Config::default())
        .owns(Api::<Pod>::all(client.clone()), owned.clone())
        .owns(Api::<Service>::all(client.clone()), owned)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((job, _)) => tracing::debug!(job = %job.name, "reconciled"),
                Err(error) => tracing::warn!(%error, "reconcile error"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests;
