//! The Kubernetes operator for ElasticJobs: `ductile-operator`, configured
//! by the `DUCTILE_OPERATOR_*` variables the Helm chart sets, or by the
//! same flags as `ductile operator` (see `docs/operator.md`). Logs follow
//! `DUCTILE_LOG`.

use clap::Parser;
use ductile_operator::k8s::entry::{run_process, OperatorArgs};

/// `ductile-operator`: the ElasticJob operator.
#[derive(Parser, Debug)]
#[command(name = "ductile-operator", version, about = "The ElasticJob operator")]
struct Cli {
    #[command(flatten)]
    args: OperatorArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let code = run_process("ductile-operator", &cli.args);
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
