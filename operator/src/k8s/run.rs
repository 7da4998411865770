//! The controllers of the operator process: the watches and the Controller
//! per namespace.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};

use super::context::*;
use super::metrics::Metrics;
use super::notices;
use super::objects::{self, ObjectSettings};
use super::pods::PodCache;
use super::reconcile::*;
use crate::crd::ElasticJob;

/// Runs the controllers until SIGINT/SIGTERM (or until `stop` resolves:
/// leadership lost). `namespaces`: one controller per namespace, sharing
/// one node watch and one [`Context`]; empty: one controller for every
/// namespace.
pub async fn run(
    client: Client,
    namespaces: Vec<String>,
    settings: ObjectSettings,
    metrics: Arc<Metrics>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let nodes_api = Api::<Node>::all(client.clone());
    let (nodes, writer) = reflector::store();
    // One watch of the nodes: the store the reconciler reads taints from,
    // and the trigger of the controllers. A node with a notice wakes every
    // job only once the store holds it (the reflector writes before it
    // yields), so the reconcile it starts sees the taint; a second,
    // independent watch could trigger it before the store had it.
    let (notices_tx, _) = tokio::sync::broadcast::channel::<()>(64);
    let notices = notices_tx.clone();
    tokio::spawn(
        reflector(writer, watcher(nodes_api, watcher::Config::default()))
            .default_backoff()
            .applied_objects()
            .for_each(move |node| {
                if let Ok(node) = node {
                    if notices::node_has_notice(&node) {
                        // No receiver: no controller runs yet; each reconciles all at start.
                        let _ = notices.send(());
                    }
                }
                async {}
            }),
    );
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.into_iter().map(Some).collect()
    };
    // One pod reflector per scope: the cache every reconcile reads its
    // job's pods from, and the trigger that wakes a pod's owner job.
    let mut stores = Vec::new();
    let mut pod_owners = Vec::new();
    for ns in &scopes {
        let (store, owners) = pod_reflector(&client, ns.as_deref());
        stores.push((ns.clone(), store));
        pod_owners.push(owners);
    }
    let mut context = Context::new(client.clone(), settings, nodes, PodCache::new(stores));
    context.metrics = metrics;
    let ctx = Arc::new(context);
    let stop = futures::FutureExt::shared(Box::pin(stop));
    tracing::info!(namespaces = ?scopes, "starting the controllers");
    futures::future::join_all(scopes.into_iter().zip(pod_owners).map(|(ns, owners)| {
        run_one(
            client.clone(),
            ns,
            node_notices(&notices_tx),
            owners,
            ctx.clone(),
            stop.clone(),
        )
    }))
    .await;
}

/// The pods of the jobs of `namespace` (`None`: all), watched in a task of
/// their own (so the cache fills whether or not a reconcile runs): the
/// store, and a stream of the ElasticJobs that own each pod the watch
/// touched (created, changed or deleted), stored before it is yielded.
fn pod_reflector(
    client: &Client,
    namespace: Option<&str>,
) -> (
    reflector::Store<Pod>,
    impl futures::Stream<Item = ObjectRef<ElasticJob>> + Send + 'static,
) {
    let api: Api<Pod> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (store, writer) = reflector::store();
    let (owners_tx, owners_rx) = futures::channel::mpsc::unbounded();
    tokio::spawn(
        reflector(writer, watcher(api, watcher::Config::default().labels(objects::JOB_LABEL)))
            .default_backoff()
            .touched_objects()
            .for_each(move |pod| {
                if let Ok(pod) = pod {
                    for owner in job_owners(&pod) {
                        // No receiver: the controller stopped; nothing to wake.
                        let _ = owners_tx.unbounded_send(owner);
                    }
                }
                async {}
            }),
    );
    (store, owners_rx)
}

/// The ElasticJobs a pod's owner references name.
fn job_owners(pod: &Pod) -> Vec<ObjectRef<ElasticJob>> {
    let Some(namespace) = pod.metadata.namespace.as_deref() else {
        return Vec::new();
    };
    pod.owner_references()
        .iter()
        .filter(|o| o.kind == ElasticJob::kind(&()) && o.api_version == ElasticJob::api_version(&()))
        .map(|o| ObjectRef::new(&o.name).within(namespace))
        .collect()
}

/// A stream that yields each time the shared node reflector stored a node
/// carrying a notice.
fn node_notices(
    tx: &tokio::sync::broadcast::Sender<()>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(tx.subscribe(), |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(()) => return Some(((), rx)),
                // Several notices at once: one reconcile of every job covers them.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return Some(((), rx)),
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

/// One controller: the ElasticJobs of `namespace` (`None`: all) and the
/// Services they own, woken for every job by `node_notices` and for a
/// pod's owner by `pod_owners` (the pod reflector's).
pub(super) async fn run_one(
    client: Client,
    namespace: Option<String>,
    node_notices: impl futures::Stream<Item = ()> + Send + 'static,
    pod_owners: impl futures::Stream<Item = ObjectRef<ElasticJob>> + Send + 'static,
    ctx: Arc<Context>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let ns = namespace.as_deref();
    let jobs: Api<ElasticJob> = api(&client, ns);
    let owned = watcher::Config::default().labels(objects::JOB_LABEL);
    let controller =
        Controller::new(jobs, watcher::Config::default()).owns(api::<Service>(&client, ns), owned);
    let requeue = ctx.requeue.clone();
    // A node with a notice concerns every job with a pod on it; which pods
    // are there is the reconcile's business, so each job looks.
    controller
        .reconcile_all_on(node_notices)
        .reconcile_on(pod_owners)
        .reconcile_on(requeue.stream(namespace))
        .graceful_shutdown_on(stop)
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
