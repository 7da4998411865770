//! The local cloud: a job's fleet on this machine, with spot capacity that
//! comes and goes, driven by the same rescale policy as on Kubernetes.
//!
//! `ductile cloud -f JOB.yaml -s SCENARIO.yaml` takes the ElasticJob a user
//! would `kubectl apply` and a scenario of what the cloud does to it, and
//! rehearses the deployment on one machine:
//!
//! * [`scenario`]: the file format (instance types with PEs, speed and
//!   prices; which types the job runs on; scripted or seeded random
//!   events), validated against the job with the line at fault;
//! * [`sim`]: the cloud itself, sans-IO in simulated time: instances,
//!   boot delays, capacity shortages, recommendations, notices and
//!   terminations, and each instance's bill;
//! * [`cgroup`]: real instance speed, as a CPU quota per instance;
//! * [`netns`]: optionally (`network: namespaces`), a network namespace
//!   per spot instance, so a terminated instance loses its link;
//! * [`driver`]: the shell that runs it in real time: the job through
//!   `ductile run`, the cloud's events into [`crate::policy::Policy`], its
//!   decisions carried out as the Kubernetes reconciler does;
//! * [`record`] and [`plot`]: what happened, the summary table, `cloud.json`
//!   and the timeline `cloud.svg`.
//!
//! See docs/cloud.md.

pub mod cgroup;
pub mod driver;
pub mod netns;
pub mod plot;
pub mod record;
pub mod scenario;
pub mod sim;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use kube::ResourceExt;

use crate::crd::ElasticJob;
use crate::policy::{Capacity, PolicyConfig};
use record::Record;
use scenario::{JobShape, Scenario, ScenarioError, Scripted};

/// Why a cloud run could not be done.
#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    /// The ElasticJob manifest is unreadable or invalid.
    #[error("{0}")]
    Job(String),
    /// The scenario is invalid.
    #[error("{0}")]
    Scenario(#[from] ScenarioError),
    /// The job could not be started.
    #[error("{0}")]
    Launch(String),
    /// A file could not be read or written.
    #[error("{}: {}", .0.display(), .1)]
    Io(PathBuf, std::io::Error),
    /// Stopped by the user before the job started.
    #[error("stopped before the job started")]
    Interrupted,
}

/// A job and its scenario, loaded and checked.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The job's name (`metadata.name`).
    pub name: String,
    /// The scenario file's name, for reports.
    pub scenario_name: String,
    /// The program (the template's first container's command).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables with plain values from the container.
    pub env: Vec<(String, String)>,
    /// `replicas`.
    pub replicas: u32,
    /// On-demand members (node 0 first).
    pub on_demand: u32,
    /// `pesPerPod`: what a relaunch starts every node with; the instance
    /// types' own PE counts decide otherwise.
    pub pes: u32,
    /// The policy's settings, from the spec.
    pub policy: PolicyConfig,
    /// The scenario.
    pub scenario: Scenario,
    /// Its scripted events.
    pub scripted: Vec<Scripted>,
}

impl Loaded {
    /// Reads an ElasticJob manifest and a scenario, and checks them together.
    pub fn from_files(job_file: &Path, scenario_file: &Path) -> Result<Self, CloudError> {
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| CloudError::Io(p.to_owned(), e));
        Self::from_texts(
            &job_file.display().to_string(),
            &read(job_file)?,
            &scenario_file.display().to_string(),
            &read(scenario_file)?,
        )
    }

    /// As [`Loaded::from_files`], from the files' texts.
    pub fn from_texts(job_file: &str, job_text: &str, scenario_file: &str, scenario_text: &str) -> Result<Self, CloudError> {
        let job: ElasticJob = serde_yaml::from_str(job_text).map_err(|e| {
            let at = e.location().map(|l| format!(":{}", l.line())).unwrap_or_default();
            CloudError::Job(format!("{job_file}{at}: not an ElasticJob: {e}"))
        })?;
        job.spec
            .validate()
            .map_err(|e| CloudError::Job(format!("{job_file}: invalid ElasticJob: {e}")))?;
        let name = job.name_any();
        if name.is_empty() {
            return Err(CloudError::Job(format!("{job_file}: metadata.name is missing")));
        }
        let container = job
            .spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .ok_or_else(|| CloudError::Job(format!("{job_file}: the pod template has no container")))?;
        let mut command: Vec<String> = container.command.clone().unwrap_or_default();
        command.extend(container.args.clone().unwrap_or_default());
        if command.is_empty() {
            return Err(CloudError::Job(format!(
                "{job_file}: the first container has no command: locally the job runs that command, the image is not used"
            )));
        }
        let program = command.remove(0);
        if let Some(every) = job.spec.checkpoint_every() {
            // As the operator does to every pod's node container.
            command.extend([crate::contract::FT_EVERY_FLAG.to_owned(), every.to_string()]);
        }
        let env = container
            .env
            .iter()
            .flatten()
            .filter_map(|v| Some((v.name.clone(), v.value.clone()?)))
            .collect();
        let replicas = u32::try_from(job.spec.replicas).unwrap_or(0).max(1);
        let on_demand = u32::try_from(job.spec.on_demand_replicas()).unwrap_or(1).clamp(1, replicas);
        let pes = u32::try_from(job.spec.pes_per_pod).unwrap_or(1).max(1);
        let policy = PolicyConfig::from_spec(&name, &job.spec);
        let shape = JobShape {
            launch_members: (0..replicas).map(|k| format!("{name}-{k}")).collect(),
            on_demand,
            newcomer_prefix: policy.newcomer_prefix.clone(),
        };
        let (scenario, scripted) = Scenario::load(scenario_file, scenario_text, &shape)?;
        Ok(Loaded {
            name,
            scenario_name: Path::new(scenario_file)
                .file_name()
                .map_or(scenario_file.to_owned(), |f| f.to_string_lossy().into_owned()),
            program,
            args: command,
            env,
            replicas,
            on_demand,
            pes,
            policy,
            scenario,
            scripted,
        })
    }

    /// The launch instances: `{job}-{k}`, node 0 and the other on-demand
    /// members first, then the spot members on the scenario's spot types in turn.
    pub fn launch_instances(&self) -> Vec<(String, Capacity, String)> {
        let fleet = &self.scenario.fleet;
        (0..self.replicas)
            .map(|k| {
                let name = format!("{}-{k}", self.name);
                if k < self.on_demand {
                    (name, Capacity::OnDemand, fleet.on_demand.clone())
                } else {
                    let spot = &fleet.spot[(k - self.on_demand) as usize % fleet.spot.len()];
                    (name, Capacity::Spot, spot.clone())
                }
            })
            .collect()
    }
}

impl Loaded {
    /// PEs of each launch instance, node 0 first (its type's).
    pub fn launch_pes(&self) -> Vec<u32> {
        self.launch_instances()
            .iter()
            .map(|(_, _, t)| self.scenario.pes_of(t))
            .collect()
    }

    /// The fleet's types whose PE count is not the job's `pesPerPod`, as
    /// `m5.xlarge (2 PEs)`: a relaunch from a checkpoint (the baselines'
    /// modes) starts every node with `pesPerPod` PEs, so it cannot keep them.
    pub fn other_shapes(&self) -> Vec<String> {
        self.scenario
            .fleet_types()
            .into_iter()
            .filter_map(|t| {
                let pes = self.scenario.pes_of(t);
                (pes != self.pes).then(|| format!("{t} ({pes} PE{})", if pes == 1 { "" } else { "s" }))
            })
            .collect()
    }
}

/// Runs the job once without the cloud (one node, no quota, no event) and
/// returns the checksum it printed: the reference a cloud run must equal.
pub fn reference_checksum(loaded: &Loaded, ductile: &Path, state_dir: &Path) -> Result<Option<String>, CloudError> {
    let output = Command::new(ductile)
        .arg("run")
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--nodes")
        .arg("1")
        .arg("--pes-per-node")
        .arg(loaded.pes.to_string())
        .arg("--")
        .arg(&loaded.program)
        .args(&loaded.args)
        .envs(loaded.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| CloudError::Launch(format!("cannot run the reference job: {e}")))?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .rev()
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("checksum=")))
        .map(str::to_owned))
}

/// Writes `cloud.json` and `cloud.svg` into `dir`.
pub fn write_outputs(record: &Record, dir: &Path) -> Result<(PathBuf, PathBuf), CloudError> {
    let json = dir.join("cloud.json");
    let svg = dir.join("cloud.svg");
    let body = serde_json::json!({ "record": record, "summary": record.summary() });
    let text = serde_json::to_string_pretty(&body).map_err(|e| CloudError::Io(json.clone(), std::io::Error::other(e)))?;
    std::fs::write(&json, text).map_err(|e| CloudError::Io(json.clone(), e))?;
    std::fs::write(&svg, plot::svg(record)).map_err(|e| CloudError::Io(svg.clone(), e))?;
    Ok((json, svg))
}

/// Everything `ductile cloud` does: run, verify, write, summarise. The
/// exit code: 0 when the job completed with the reference checksum, 1 when
/// it failed or the checksum differs, 2 for invalid input.
pub fn rehearse(
    loaded: &Loaded,
    opts: &driver::RunOptions,
    verify: bool,
    stop: &Arc<AtomicBool>,
    say: &mut dyn FnMut(&str),
) -> Result<(Record, i32), CloudError> {
    let mut record = driver::run(loaded, opts, stop, say)?;
    if verify && record.exit_code == Some(0) && record.checksum.is_some() {
        say("verifying: the same job once more, uninterrupted, on one node ...");
        let dir = opts.state_dir.with_extension("reference");
        record.reference_checksum = reference_checksum(loaded, &opts.ductile, &dir)?;
    }
    let (json, svg) = write_outputs(&record, &opts.out_dir)?;
    say(&format!("\n{}", record.table()));
    say(&format!(
        "  {:<24} {}, {}, {}",
        "files",
        json.display(),
        svg.display(),
        opts.out_dir.join("job.log").display()
    ));
    let ok = record.exit_code == Some(0) && record.checksum_ok();
    Ok((record, if ok { 0 } else { 1 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const JOB: &str = "\
apiVersion: ductile.dev/v1alpha1
kind: ElasticJob
metadata: { name: demo }
spec:
  replicas: 3
  minReplicas: 2
  pesPerPod: 1
  template:
    spec:
      containers:
        - name: node
          image: apps
          command: [jacobi2d, --grid, '256']
          args: [--iters, '10']
          env: [{ name: DUCTILE_LOG, value: warn }]
  onDemand: { replicas: 1 }
";

    const SCENARIO: &str = "\
instanceTypes:
  - { name: a, pes: 1, speed: 1, price: { onDemand: 1, spot: 0.4 } }
  - { name: b, pes: 1, speed: 0.5, price: { onDemand: 0.5, spot: 0.2 } }
fleet: { onDemand: a, spot: [b, a] }
events:
  - { at: 5, interruption: demo-2 }
";

    #[test]
    fn an_elastic_job_and_a_scenario_load_together() {
        let l = Loaded::from_texts("job.yaml", JOB, "s.yaml", SCENARIO).expect("valid");
        assert_eq!(l.name, "demo");
        assert_eq!(l.program, "jacobi2d");
        assert_eq!(l.args, ["--grid", "256", "--iters", "10"]);
        assert_eq!(l.env, [("DUCTILE_LOG".to_owned(), "warn".to_owned())]);
        assert_eq!((l.replicas, l.on_demand, l.pes), (3, 1, 1));
        assert_eq!(l.policy.newcomer_prefix, "demo-n");
        assert_eq!(
            l.launch_instances(),
            vec![
                ("demo-0".to_owned(), Capacity::OnDemand, "a".to_owned()),
                ("demo-1".to_owned(), Capacity::Spot, "b".to_owned()),
                ("demo-2".to_owned(), Capacity::Spot, "a".to_owned()),
            ]
        );
    }

    #[test]
    fn an_invalid_job_or_a_scenario_for_another_job_is_refused() {
        let e = Loaded::from_texts("job.yaml", &JOB.replace("replicas: 3", "replicas: 2"), "s.yaml", SCENARIO)
            .expect_err("demo-2 does not exist with one replica");
        assert!(e.to_string().starts_with("s.yaml:6: no instance \"demo-2\""), "{e}");
        let e = Loaded::from_texts("job.yaml", &JOB.replace("minReplicas: 2", "minReplicas: 9"), "s.yaml", SCENARIO)
            .expect_err("min above replicas");
        assert!(e.to_string().contains("invalid ElasticJob"), "{e}");
        let e = Loaded::from_texts("job.yaml", "apiVersion: v1\nkind: ]\n", "s.yaml", SCENARIO)
            .expect_err("not YAML");
        assert!(e.to_string().starts_with("job.yaml:2:"), "{e}");
    }

    #[test]
    fn types_of_other_pe_counts_load_and_are_named_for_a_relaunch() {
        let l = Loaded::from_texts("job.yaml", JOB, "s.yaml", SCENARIO).expect("valid");
        assert_eq!(l.launch_pes(), [1, 1, 1]);
        assert!(l.other_shapes().is_empty(), "every type runs pesPerPod PEs");
        let mixed = SCENARIO.replace("name: b, pes: 1", "name: b, pes: 2");
        let l = Loaded::from_texts("job.yaml", JOB, "s.yaml", &mixed).expect("mixed shapes are valid");
        assert_eq!(l.launch_pes(), [1, 2, 1], "demo-1 runs on b");
        assert_eq!(l.other_shapes(), ["b (2 PEs)"]);
        let l = Loaded::from_texts("job.yaml", &JOB.replace("pesPerPod: 1", "pesPerPod: 2"), "s.yaml", SCENARIO)
            .expect("the types decide the PEs");
        assert_eq!(l.other_shapes(), ["a (1 PE)", "b (1 PE)"]);
    }

    #[test]
    fn fault_tolerance_in_the_spec_adds_ft_every_to_the_nodes_arguments() {
        let job = JOB.replace("  onDemand: { replicas: 1 }\n", "  onDemand: { replicas: 1 }\n  faultTolerance: { checkpointEvery: 5 }\n");
        let l = Loaded::from_texts("job.yaml", &job, "s.yaml", SCENARIO).expect("valid");
        assert_eq!(l.args, ["--grid", "256", "--iters", "10", "+ft-every", "5"]);
        assert_eq!(crate::local::fault_tolerance_every(&l.args), Some(5));
        let l = Loaded::from_texts("job.yaml", JOB, "s.yaml", SCENARIO).expect("valid");
        assert_eq!(crate::local::fault_tolerance_every(&l.args), None);
    }

    /// The repository's example of members lost without notice loads, with
    /// its job's fault tolerance; node 0's instance cannot be terminated.
    #[test]
    fn the_unannounced_example_loads_with_fault_tolerance() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let l = Loaded::from_files(&dir.join("ft-job.yaml"), &dir.join("unannounced.yaml")).expect("valid");
        assert_eq!(crate::local::fault_tolerance_every(&l.args), Some(5));
        let terminated: Vec<&str> = l
            .scripted
            .iter()
            .filter_map(|s| match &s.action {
                scenario::Action::Terminate(name) => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(terminated, ["demo-2", "demo-3"]);
        let text = std::fs::read_to_string(dir.join("unannounced.yaml")).unwrap().replace("terminate: demo-3", "terminate: demo-0");
        let job = std::fs::read_to_string(dir.join("ft-job.yaml")).unwrap();
        let e = Loaded::from_texts("ft-job.yaml", &job, "unannounced.yaml", &text).expect_err("node 0");
        assert!(e.to_string().contains("demo-0 is node 0's instance"), "{e}");
    }
}
