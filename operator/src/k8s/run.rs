//! The controllers of the operator process: the watches and the Controller
//! per namespace.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client, Resource};

use super::context::*;
use super::metrics::Metrics;
use super::notices;
use super::objects::{self, ObjectSettings};
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
    // The node store the reconciler reads taints from.
    tokio::spawn(
        reflector(
            writer,
            watcher(nodes_api.clone(), watcher::Config::default()),
        )
        .default_backoff()
        .applied_objects()
        .for_each(|_| async {}),
    );
    let mut context = Context::new(client.clone(), settings, nodes);
    context.metrics = metrics;
    let ctx = Arc::new(context);
    let stop = futures::FutureExt::shared(Box::pin(stop));
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.into_iter().map(Some).collect()
    };
    tracing::info!(namespaces = ?scopes, "starting the controllers");
    futures::future::join_all(scopes.into_iter().map(|ns| {
        run_one(
            client.clone(),
            ns,
            nodes_api.clone(),
            ctx.clone(),
            stop.clone(),
        )
    }))
    .await;
}

/// One controller: the ElasticJobs of `namespace` (`None`: all), the pods
/// and Services they own, and the nodes whose taints concern them.
pub(super) async fn run_one(
    client: Client,
    namespace: Option<String>,
    nodes_api: Api<Node>,
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
    let controller = Controller::new(jobs, watcher::Config::default())
        .owns(api::<Pod>(&client, ns), owned.clone())
        .owns(api::<Service>(&client, ns), owned);
    let store = controller.store();
    let requeue = ctx.requeue.clone();
    // A node with a notice concerns every job with a pod on it; which pods
    // are there is the reconcile's business, so each job looks.
    controller
        .watches(nodes_api, watcher::Config::default(), move |node: Node| {
            if notices::node_has_notice(&node) {
                store
                    .state()
                    .iter()
                    .map(|job| ObjectRef::from_obj(job.as_ref()))
                    .collect()
            } else {
                Vec::new()
            }
        })
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
