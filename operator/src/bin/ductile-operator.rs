//! The Kubernetes operator for ElasticJobs: `ductile-operator`, configured
//! by the `DUCTILE_OPERATOR_*` variables the Helm chart sets (see
//! `docs/operator.md`). Logs follow `DUCTILE_LOG`.

use ductile_operator::k8s::entry::{main as operator_main, OperatorConfig};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DUCTILE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();
    let config = match OperatorConfig::from_lookup(|name| std::env::var(name).ok()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("ductile-operator: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    match operator_main(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ductile-operator: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
