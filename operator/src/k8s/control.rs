//! How the reconciler reaches a running job's PE 0: the control endpoint of
//! `ductile_coordinator::control`, behind a small trait so that tests can
//! point it at a fake job (a real `serve_connection` server on loopback).
//!
//! The client is blocking (it is the same one `ductile status` uses); the
//! reconciler calls it through `tokio::task::spawn_blocking`.

use std::time::Duration;

use ductile_coordinator::control::{
    ControlClient, ControlError, JobStatus, RescaleReport, RescaleRequest,
};
use ductile_coordinator::Secret;

/// Where a job's control endpoint is and how to prove the job secret.
#[derive(Clone, Debug)]
pub struct ControlTarget {
    /// `host:port` of node 0's control endpoint.
    pub address: String,
    /// The job secret.
    pub secret: Secret,
}

/// A job's control endpoint, as the reconciler uses it.
pub trait ControlEndpoint: Send + Sync + 'static {
    /// The job's membership and pending newcomers.
    fn status(&self, target: &ControlTarget) -> Result<JobStatus, ControlError>;
    /// Asks for a rescale; waits up to `timeout` for the job to run at its
    /// new size; returns the report and the status right after it (which
    /// names the admitted newcomers' hosts).
    fn rescale(
        &self,
        target: &ControlTarget,
        request: RescaleRequest,
        timeout: Duration,
    ) -> Result<(RescaleReport, JobStatus), ControlError>;
}

/// The real endpoint: a TCP connection per call, authenticated with the
/// job secret.
#[derive(Clone, Debug)]
pub struct TcpControl {
    /// Connect and read timeout of status calls and of the connection set-up.
    pub timeout: Duration,
}

impl Default for TcpControl {
    fn default() -> Self {
        TcpControl {
            timeout: Duration::from_secs(5),
        }
    }
}

impl ControlEndpoint for TcpControl {
    fn status(&self, target: &ControlTarget) -> Result<JobStatus, ControlError> {
        ControlClient::connect(&target.address, &target.secret, self.timeout)?.status()
    }

    fn rescale(
        &self,
        target: &ControlTarget,
        request: RescaleRequest,
        timeout: Duration,
    ) -> Result<(RescaleReport, JobStatus), ControlError> {
        let mut client = ControlClient::connect(&target.address, &target.secret, self.timeout)?;
        let report = client.rescale(request, timeout)?;
        let status = client.status()?;
        Ok((report, status))
    }
}
