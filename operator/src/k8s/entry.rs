//! The operator process: configuration from the environment the Helm chart
//! and `manifests/install.yaml` set (each variable also has a flag, which
//! wins), the metrics server, leader election, then the controller. The
//! `ductile-operator` binary and `ductile operator` both call
//! [`run_process`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kube::{Api, Client};

use super::leader::{LeaseLock, RENEW_DEADLINE, RETRY_PERIOD};
use super::metrics::{spawn_server, Metrics};
use super::objects::ObjectSettings;

/// `true`/`false`: elect a leader through a Lease before reconciling.
pub const ENV_LEADER_ELECTION: &str = "DUCTILE_OPERATOR_LEADER_ELECTION";
/// Name of the Lease (in the operator's namespace).
pub const ENV_LEASE: &str = "DUCTILE_OPERATOR_LEASE";
/// Comma-separated namespaces to watch (one controller each); empty: all.
pub const ENV_WATCH_NAMESPACES: &str = "DUCTILE_OPERATOR_WATCH_NAMESPACES";
/// Port of `/metrics`, `/healthz` and `/readyz`.
pub const ENV_METRICS_PORT: &str = "DUCTILE_OPERATOR_METRICS_PORT";
/// Image of the coordinator container in node 0's pod (the operator's own image).
pub const ENV_COORDINATOR_IMAGE: &str = "DUCTILE_OPERATOR_COORDINATOR_IMAGE";
/// `true`/`false`: give every job a NetworkPolicy (only its own pods and
/// the operator's namespace reach its pods' ports).
pub const ENV_NETWORK_POLICY: &str = "DUCTILE_OPERATOR_NETWORK_POLICY";
/// This replica's pod name (downward API): its leader identity and Event instance.
pub const ENV_POD_NAME: &str = "POD_NAME";
/// The operator's namespace (downward API): where the Lease lives.
pub const ENV_POD_NAMESPACE: &str = "POD_NAMESPACE";

/// What the operator process runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct OperatorConfig {
    /// Elect a leader before reconciling.
    pub leader_election: bool,
    /// The Lease's name.
    pub lease: String,
    /// Namespaces to watch, one controller each; empty: all.
    pub namespaces: Vec<String>,
    /// Where the metrics server listens.
    pub metrics: SocketAddr,
    /// Settings of the objects the operator creates.
    pub settings: ObjectSettings,
    /// Leader identity.
    pub identity: String,
    /// Namespace of the Lease.
    pub own_namespace: String,
}

/// A configuration variable with a value that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{name}={value:?}: {reason}")]
pub struct ConfigError {
    /// The variable.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// What was expected.
    pub reason: String,
}

impl OperatorConfig {
    /// Reads the configuration through `var` (the process environment in
    /// [`main`]; a map in tests).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let bad = |name: &'static str, value: &str, reason: &str| ConfigError {
            name,
            value: value.to_owned(),
            reason: reason.to_owned(),
        };
        let leader_election = match var(ENV_LEADER_ELECTION).as_deref().map(str::trim) {
            None | Some("") | Some("false") => false,
            Some("true") => true,
            Some(other) => return Err(bad(ENV_LEADER_ELECTION, other, "expected true or false")),
        };
        let mut namespaces: Vec<String> = Vec::new();
        let listed = var(ENV_WATCH_NAMESPACES).unwrap_or_default();
        for ns in listed.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !is_dns_label(ns) {
                return Err(bad(
                    ENV_WATCH_NAMESPACES,
                    &listed,
                    &format!("{ns:?} is not a namespace name (lower-case letters, digits and '-', at most 63)"),
                ));
            }
            if !namespaces.iter().any(|n| n == ns) {
                namespaces.push(ns.to_owned());
            }
        }
        let port = match var(ENV_METRICS_PORT) {
            None => 8080,
            Some(text) => text
                .trim()
                .parse::<u16>()
                .map_err(|e| bad(ENV_METRICS_PORT, &text, &e.to_string()))?,
        };
        let mut settings = ObjectSettings::default();
        if let Some(image) = var(ENV_COORDINATOR_IMAGE).filter(|i| !i.trim().is_empty()) {
            settings.coordinator_image = image;
        }
        let network_policy = match var(ENV_NETWORK_POLICY).as_deref().map(str::trim) {
            None | Some("") | Some("false") => false,
            Some("true") => true,
            Some(other) => return Err(bad(ENV_NETWORK_POLICY, other, "expected true or false")),
        };
        let identity =
            var(ENV_POD_NAME).unwrap_or_else(|| format!("ductile-operator-{}", std::process::id()));
        let own_namespace = var(ENV_POD_NAMESPACE).unwrap_or_else(|| "ductile-system".to_owned());
        if leader_election && var(ENV_POD_NAME).is_none() {
            return Err(bad(
                ENV_POD_NAME,
                "",
                "leader election needs each replica's pod name",
            ));
        }
        if network_policy {
            settings.network_policy = Some(own_namespace.clone());
        }
        Ok(OperatorConfig {
            leader_election,
            lease: var(ENV_LEASE)
                .filter(|l| !l.is_empty())
                .unwrap_or_else(|| "ductile-operator".to_owned()),
            namespaces,
            metrics: SocketAddr::from(([0, 0, 0, 0], port)),
            settings,
            identity,
            own_namespace,
        })
    }
}

/// Whether `name` can name a namespace (an RFC 1123 DNS label).
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The operator's flags (`ductile operator`, `ductile-operator`). Each
/// stands for one of the variables above and wins over it; what is not
/// given comes from the environment.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct OperatorArgs {
    /// Watch this namespace (repeat for several; one controller each)
    /// [default: DUCTILE_OPERATOR_WATCH_NAMESPACES, else every namespace].
    #[arg(long = "namespace", value_name = "NS")]
    pub namespaces: Vec<String>,
    /// Hold the Lease before reconciling [default: DUCTILE_OPERATOR_LEADER_ELECTION].
    #[arg(long)]
    pub leader_election: bool,
    /// Name of the Lease [default: DUCTILE_OPERATOR_LEASE, else ductile-operator].
    #[arg(long, value_name = "NAME")]
    pub lease: Option<String>,
    /// Port of /metrics and the probes [default: DUCTILE_OPERATOR_METRICS_PORT, else 8080].
    #[arg(long, value_name = "PORT")]
    pub metrics_port: Option<u16>,
    /// Image of node 0's coordinator container [default: DUCTILE_OPERATOR_COORDINATOR_IMAGE].
    #[arg(long, value_name = "IMAGE")]
    pub coordinator_image: Option<String>,
    /// Log lines as `text` or one JSON object per line [default: DUCTILE_LOG_FORMAT, else text].
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<ductile_coordinator::logs::LogFormat>,
}

impl OperatorArgs {
    /// The configuration: these flags over the variables `var` reads.
    pub fn config(
        &self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<OperatorConfig, ConfigError> {
        OperatorConfig::from_lookup(|name| match name {
            ENV_WATCH_NAMESPACES if !self.namespaces.is_empty() => Some(self.namespaces.join(",")),
            ENV_LEADER_ELECTION if self.leader_election => Some("true".to_owned()),
            ENV_LEASE if self.lease.is_some() => self.lease.clone(),
            ENV_METRICS_PORT if self.metrics_port.is_some() => {
                self.metrics_port.map(|p| p.to_string())
            }
            ENV_COORDINATOR_IMAGE if self.coordinator_image.is_some() => {
                self.coordinator_image.clone()
            }
            other => var(other),
        })
    }
}

/// The whole operator process, for a `main`: logs to stderr (`DUCTILE_LOG`,
/// default `info`; `--log-format`), configuration from `args` and the environment (exit 2
/// when it is bad), a tokio runtime, [`main`] (exit 1 when it fails).
pub fn run_process(program: &str, args: &OperatorArgs) -> i32 {
    let logs = ductile_coordinator::logs::LogSetup {
        default_filter: "info",
        target: false,
        span_close: false,
    };
    match args.log_format {
        Some(format) => ductile_coordinator::logs::init(logs, format),
        None => ductile_coordinator::logs::init_from_env(logs),
    }
    let config = match args.config(|name| std::env::var(name).ok()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{program}: {error}");
            return 2;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{program}: cannot start the async runtime: {error}");
            return 1;
        }
    };
    match runtime.block_on(main(config)) {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("{program}: {}", crate::cli::one_line(&error));
            1
        }
    }
}

/// Runs the operator: metrics server, leader election when configured,
/// then the controller until SIGTERM or lost leadership.
pub async fn main(config: OperatorConfig) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let metrics = Arc::new(Metrics::process());
    let ready = Arc::new(AtomicBool::new(false));
    let bound = spawn_server(config.metrics, metrics.clone(), ready.clone()).await?;
    tracing::info!(%bound, "metrics on /metrics, probes on /healthz and /readyz");

    let lock = Arc::new(LeaseLock::new(
        Api::namespaced(client.clone(), &config.own_namespace),
        config.lease.clone(),
        config.identity.clone(),
    ));
    let leadership_lost = Arc::new(AtomicBool::new(false));
    let mut renewals = None;
    // A follower is ready (it serves probes and waits); only the leader reconciles.
    ready.store(true, Ordering::Relaxed);
    let stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>> = if config
        .leader_election
    {
        tracing::info!(lease = %config.lease, identity = %config.identity, "waiting for leadership");
        lock.acquire(RETRY_PERIOD).await;
        tracing::info!(lease = %config.lease, "leading");
        let keeper = lock.clone();
        let (lost, lost_rx) = tokio::sync::oneshot::channel::<()>();
        let flag = leadership_lost.clone();
        renewals = Some(tokio::spawn(async move {
            keeper.keep(RETRY_PERIOD, RENEW_DEADLINE).await;
            flag.store(true, Ordering::Relaxed);
            let _ = lost.send(());
        }));
        Box::pin(async move {
            let _ = lost_rx.await;
        })
    } else {
        Box::pin(std::future::pending())
    };
    super::run(client, config.namespaces, config.settings, metrics, stop).await;
    if let Some(renewals) = renewals {
        // Stopped (SIGTERM) while leading: stop renewing and give the lease
        // up, so that the follower takes over now, not in 15 s.
        renewals.abort();
        if !leadership_lost.load(Ordering::Relaxed) {
            match lock.release().await {
                Ok(()) => tracing::info!(lease = %config.lease, "lease released"),
                Err(error) => tracing::warn!(lease = %config.lease, %error, "could not release the lease; it expires"),
            }
        }
    }
    if leadership_lost.load(Ordering::Relaxed) {
        // Exit non-zero: the Deployment restarts this replica as a follower.
        anyhow::bail!(
            "leadership of lease {} lost; stopped reconciling",
            config.lease
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<OperatorConfig, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        OperatorConfig::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn the_chart_environment_configures_the_operator() {
        let c = config(&[
            ("DUCTILE_OPERATOR_LEADER_ELECTION", "true"),
            ("DUCTILE_OPERATOR_LEASE", "ductile-lock"),
            ("DUCTILE_OPERATOR_WATCH_NAMESPACES", " hpc "),
            ("DUCTILE_OPERATOR_METRICS_PORT", "9090"),
            ("DUCTILE_OPERATOR_COORDINATOR_IMAGE", "registry/ductile:1.2"),
            ("POD_NAME", "ductile-7d9-abc"),
            ("POD_NAMESPACE", "ductile-system"),
            ("DUCTILE_OPERATOR_NETWORK_POLICY", "true"),
        ])
        .unwrap();
        assert!(c.leader_election);
        assert_eq!(c.settings.network_policy.as_deref(), Some("ductile-system"));
        assert_eq!(c.lease, "ductile-lock");
        assert_eq!(c.namespaces, ["hpc"]);
        assert_eq!(c.metrics, "0.0.0.0:9090".parse().unwrap());
        assert_eq!(c.settings.coordinator_image, "registry/ductile:1.2");
        assert_eq!(c.identity, "ductile-7d9-abc");

        let defaults = config(&[]).unwrap();
        assert!(!defaults.leader_election);
        assert!(defaults.namespaces.is_empty(), "every namespace");
        assert_eq!(defaults.metrics.port(), 8080);
        assert_eq!(defaults.lease, "ductile-operator");
        assert_eq!(defaults.settings.network_policy, None);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let e = config(&[("DUCTILE_OPERATOR_METRICS_PORT", "http")]).unwrap_err();
        assert_eq!(e.name, "DUCTILE_OPERATOR_METRICS_PORT");
        let e = config(&[("DUCTILE_OPERATOR_LEADER_ELECTION", "yes")]).unwrap_err();
        assert!(e.to_string().contains("expected true or false"), "{e}");
        let e = config(&[("DUCTILE_OPERATOR_WATCH_NAMESPACES", "hpc,Team_A")]).unwrap_err();
        assert_eq!(e.name, "DUCTILE_OPERATOR_WATCH_NAMESPACES");
        assert!(
            e.to_string().contains("\"Team_A\" is not a namespace name"),
            "{e}"
        );
        let e = config(&[("DUCTILE_OPERATOR_LEADER_ELECTION", "true")]).unwrap_err();
        assert_eq!(e.name, "POD_NAME");
    }

    #[test]
    fn several_namespaces_are_watched_once_each() {
        let c = config(&[("DUCTILE_OPERATOR_WATCH_NAMESPACES", "hpc, ml,hpc,")]).unwrap();
        assert_eq!(c.namespaces, ["hpc", "ml"]);
    }

    #[test]
    fn flags_win_over_the_environment() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: OperatorArgs,
        }
        let env = [
            ("DUCTILE_OPERATOR_WATCH_NAMESPACES", "ignored"),
            ("DUCTILE_OPERATOR_METRICS_PORT", "9090"),
            ("POD_NAME", "op-1"),
        ];
        let lookup = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        };
        let cli = Cli::try_parse_from([
            "ductile-operator",
            "--namespace",
            "hpc",
            "--namespace",
            "ml",
            "--leader-election",
            "--lease",
            "lock",
        ])
        .unwrap();
        let c = cli.args.config(lookup).unwrap();
        assert_eq!(c.namespaces, ["hpc", "ml"]);
        assert!(c.leader_election);
        assert_eq!(c.lease, "lock");
        assert_eq!(c.metrics.port(), 9090, "from the environment");
        let bad = Cli::try_parse_from(["ductile-operator", "--metrics-port", "http"]);
        assert!(bad.is_err());
        let bad = Cli::try_parse_from(["ductile-operator", "--namespace", "Bad!"])
            .unwrap()
            .args
            .config(lookup)
            .unwrap_err();
        assert!(bad.to_string().contains("is not a namespace name"), "{bad}");
    }
}
