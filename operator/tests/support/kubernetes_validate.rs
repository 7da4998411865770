//! Runs `kubernetes-validate` (PyPI; it bundles the Kubernetes API schemas)
//! on YAML files, strict and offline, for the oldest and newest Kubernetes
//! versions the chart supports. It never skips: `scripts/test` installs it
//! (`scripts/install-kubernetes-validate`, into target/k8s-tools/); a
//! checkout without it fails, naming that script. Shared by `crd.rs` (the
//! CRD and the install bundle) and `chart.rs` (the rendered chart).

use std::ffi::OsString;
use std::path::Path;

/// The Kubernetes versions every shipped object is validated for: the
/// chart's `kubeVersion` floor and the newest the operator is built for.
pub const VERSIONS: [&str; 2] = ["1.30.0", "1.35.0"];

fn program(root: &Path) -> OsString {
    let installed = root.join("target/k8s-tools/bin/kubernetes-validate");
    if installed.exists() {
        installed.into_os_string()
    } else {
        "kubernetes-validate".into()
    }
}

/// Validates `files` (relative to `root`, or absolute) for `version`,
/// strict. Ok: what the tool printed (warnings, if any); Err: its report.
pub fn validate(root: &Path, version: &str, files: &[&Path]) -> Result<String, String> {
    let out = std::process::Command::new(program(root))
        .current_dir(root)
        .args(["-k", version, "--strict", "--quiet"])
        .args(files)
        .output()
        .unwrap_or_else(|e| {
            panic!("kubernetes-validate: {e}; run scripts/install-kubernetes-validate")
        });
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(report)
    } else {
        Err(format!(
            "kubernetes-validate -k {version} failed:\n{report}"
        ))
    }
}
