//! The environment contract between a fleet (the local CLI, the Kubernetes
//! operator) and a job's processes: the variables a fleet sets on every node it
//! starts, in one place. Nodes read them; fleets write them.

use crate::proto::Role;
use crate::secret::{Secret, SecretError};

/// `host:port` of the job's coordinator.
pub const ENV_COORDINATOR: &str = "DUCTILE_COORDINATOR";
/// The job secret as 64 hex characters. Takes precedence over [`ENV_SECRET_FILE`].
pub const ENV_SECRET: &str = "DUCTILE_SECRET";
/// Path of a file holding the hex job secret (a mounted Kubernetes Secret).
pub const ENV_SECRET_FILE: &str = "DUCTILE_SECRET_FILE";
/// How the process joins: [`ROLE_LAUNCH`] or [`ROLE_NEWCOMER`].
pub const ENV_ROLE: &str = "DUCTILE_ROLE";
/// Launch index in `0..N` of a launch member; it becomes its node id at epoch 1.
pub const ENV_LAUNCH_INDEX: &str = "DUCTILE_LAUNCH_INDEX";
/// Number of PEs (scheduler threads) the node runs.
pub const ENV_PES: &str = "DUCTILE_PES";
/// Set by a launcher that runs several nodes of the job on one machine
/// (the local fleet): this node's number among them (0, 1, ...). Each node
/// sees every CPU of the machine; `+pe-affinity` pins its PE `i` to the
/// `(i + slot) mod n`-th, so that PE `i` of different nodes does not pile
/// up on the same CPU.
pub const ENV_HOST_SLOT: &str = "DUCTILE_HOST_SLOT";
/// IP address the node's transport listens on.
pub const ENV_BIND: &str = "DUCTILE_BIND";
/// IP address peers should dial, when it differs from [`ENV_BIND`] (NAT, pod IPs).
pub const ENV_ADVERTISE: &str = "DUCTILE_ADVERTISE";
/// Listen address of the control endpoint (status, rescale requests); used by
/// node 0. Unset: no control endpoint. A port of 0 lets the OS choose.
pub const ENV_CONTROL: &str = "DUCTILE_CONTROL";
/// File node 0 writes its bound control address to (local fleets, where the
/// port is chosen by the OS).
pub const ENV_CONTROL_FILE: &str = "DUCTILE_CONTROL_FILE";
/// Listen address of the node's Prometheus endpoint (`GET /metrics`, every
/// node, docs/metrics.md). Unset: none. A port of 0 lets the OS choose.
pub const ENV_METRICS: &str = "DUCTILE_METRICS";
/// File the node writes its bound metrics address to (local fleets).
pub const ENV_METRICS_FILE: &str = "DUCTILE_METRICS_FILE";
/// Transport the nodes use: `tcp` (also when unset) or `ucx`.
pub const ENV_TRANSPORT: &str = "DUCTILE_TRANSPORT";
/// A launch member restores the job from this checkpoint directory instead
/// of running main (the kill-and-restart baseline; every launch member gets
/// the same value).
pub const ENV_RESTORE: &str = "DUCTILE_RESTORE";
/// Exit code of every process of a job that ended after writing a
/// checkpoint it was asked to end with (`EX_TEMPFAIL`: to be continued).
pub const EXIT_CHECKPOINTED: i32 = 75;
/// Local fleet only: pid of the launcher (informational; the node watches its
/// launcher through [`crate::lifeline::ENV_LAUNCHER_FD`], which wrapper
/// scripts do not break).
pub const ENV_LAUNCHER_PID: &str = "DUCTILE_LAUNCHER_PID";
/// `tracing` filter directive for the process's logs (e.g. `info,ductile=debug`).
pub const ENV_LOG: &str = "DUCTILE_LOG";
/// Seconds a node keeps trying to rejoin its coordinator after the connection
/// dropped (a coordinator restart), before it ends the job; `0` ends it at once.
/// Default [`DEFAULT_COORDINATOR_RECONNECT`].
pub const ENV_COORDINATOR_RECONNECT: &str = "DUCTILE_COORDINATOR_RECONNECT";
/// How long a node tries to rejoin its coordinator when [`ENV_COORDINATOR_RECONNECT`] is unset.
pub const DEFAULT_COORDINATOR_RECONNECT: std::time::Duration = std::time::Duration::from_secs(30);

/// Value of [`ENV_ROLE`] for a launch member.
pub const ROLE_LAUNCH: &str = "launch";
/// Value of [`ENV_ROLE`] for a newcomer.
pub const ROLE_NEWCOMER: &str = "newcomer";

/// A missing or malformed contract variable.
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    /// Neither secret variable is set.
    #[error("no job secret: set {ENV_SECRET} (64 hex characters) or {ENV_SECRET_FILE} (a file holding them)")]
    NoSecret,
    /// The secret text is malformed.
    #[error("job secret from {source_name} is invalid: {error}")]
    BadSecret {
        /// Where it came from (variable or file).
        source_name: String,
        /// What is wrong with it.
        error: SecretError,
    },
    /// The secret file could not be read.
    #[error("cannot read job secret file {path}: {error}")]
    SecretFile {
        /// The path.
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// A variable is missing.
    #[error("{0} is not set")]
    Missing(&'static str),
    /// A variable has a value that does not parse.
    #[error("{name}={value:?} is invalid: {reason}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        reason: String,
    },
}

/// Reads a secret from a file path (hex text, surrounding whitespace ignored).
pub fn secret_from_file(path: &str) -> Result<Secret, ContractError> {
    let text = std::fs::read_to_string(path).map_err(|error| ContractError::SecretFile {
        path: path.to_owned(),
        error,
    })?;
    Secret::from_hex(&text).map_err(|error| ContractError::BadSecret {
        source_name: path.to_owned(),
        error,
    })
}

/// Reads the job secret from [`ENV_SECRET`], or else from the file named by [`ENV_SECRET_FILE`].
pub fn secret_from_env() -> Result<Secret, ContractError> {
    if let Ok(hex) = std::env::var(ENV_SECRET) {
        return Secret::from_hex(&hex).map_err(|error| ContractError::BadSecret {
            source_name: ENV_SECRET.to_owned(),
            error,
        });
    }
    match std::env::var(ENV_SECRET_FILE) {
        Ok(path) => secret_from_file(&path),
        Err(_) => Err(ContractError::NoSecret),
    }
}

/// Parses a role and launch index as found in [`ENV_ROLE`] and [`ENV_LAUNCH_INDEX`].
pub fn parse_role(role: &str, launch_index: Option<&str>) -> Result<Role, ContractError> {
    match role {
        ROLE_NEWCOMER => Ok(Role::Newcomer),
        ROLE_LAUNCH => {
            let text = launch_index.ok_or(ContractError::Missing(ENV_LAUNCH_INDEX))?;
            let index = text
                .trim()
                .parse::<u32>()
                .map_err(|e| ContractError::Invalid {
                    name: ENV_LAUNCH_INDEX,
                    value: text.to_owned(),
                    reason: e.to_string(),
                })?;
            Ok(Role::Launch { index })
        }
        other => Err(ContractError::Invalid {
            name: ENV_ROLE,
            value: other.to_owned(),
            reason: format!("expected {ROLE_LAUNCH:?} or {ROLE_NEWCOMER:?}"),
        }),
    }
}

/// Parses a reconnect bound as found in [`ENV_COORDINATOR_RECONNECT`]:
/// seconds, fractions allowed; unset or empty means the default.
pub fn parse_reconnect(value: Option<&str>) -> Result<std::time::Duration, ContractError> {
    let Some(text) = value.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(DEFAULT_COORDINATOR_RECONNECT);
    };
    let invalid = |reason: &str| ContractError::Invalid {
        name: ENV_COORDINATOR_RECONNECT,
        value: text.to_owned(),
        reason: reason.to_owned(),
    };
    let secs: f64 = text
        .parse()
        .map_err(|_| invalid("expected seconds, e.g. 30 or 0.5"))?;
    std::time::Duration::try_from_secs_f64(secs)
        .map_err(|_| invalid("expected a finite number of seconds, 0 or more"))
}

/// Reads the reconnect bound from [`ENV_COORDINATOR_RECONNECT`].
pub fn reconnect_from_env() -> Result<std::time::Duration, ContractError> {
    parse_reconnect(std::env::var(ENV_COORDINATOR_RECONNECT).ok().as_deref())
}

/// Reads the role from [`ENV_ROLE`] (and [`ENV_LAUNCH_INDEX`] for launch members).
pub fn role_from_env() -> Result<Role, ContractError> {
    let role = std::env::var(ENV_ROLE).map_err(|_| ContractError::Missing(ENV_ROLE))?;
    let index = std::env::var(ENV_LAUNCH_INDEX).ok();
    parse_role(&role, index.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse() {
        assert_eq!(
            parse_role("launch", Some("3")).ok(),
            Some(Role::Launch { index: 3 })
        );
        assert_eq!(parse_role("newcomer", None).ok(), Some(Role::Newcomer));
        assert!(matches!(
            parse_role("launch", None),
            Err(ContractError::Missing(_))
        ));
        assert!(matches!(
            parse_role("boss", None),
            Err(ContractError::Invalid { .. })
        ));
    }

    #[test]
    fn reconnect_bounds_parse() {
        use std::time::Duration;
        assert_eq!(
            parse_reconnect(None).ok(),
            Some(DEFAULT_COORDINATOR_RECONNECT)
        );
        assert_eq!(
            parse_reconnect(Some(" ")).ok(),
            Some(DEFAULT_COORDINATOR_RECONNECT)
        );
        assert_eq!(parse_reconnect(Some("0")).ok(), Some(Duration::ZERO));
        assert_eq!(
            parse_reconnect(Some("2.5")).ok(),
            Some(Duration::from_millis(2500))
        );
        for bad in ["-1", "soon", "inf", "NaN"] {
            let err = parse_reconnect(Some(bad)).expect_err(bad);
            assert!(
                err.to_string()
                    .starts_with("DUCTILE_COORDINATOR_RECONNECT="),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn secret_file_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("secret");
        let s = Secret::generate();
        std::fs::write(&path, format!("{}\n", s.to_hex())).expect("write");
        let got = secret_from_file(path.to_str().expect("utf8")).expect("read");
        assert_eq!(got, s);
        assert!(matches!(
            secret_from_file("/nonexistent/ductile"),
            Err(ContractError::SecretFile { .. })
        ));
    }
}
