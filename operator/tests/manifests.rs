//! The YAML shipped with the operator, checked without a cluster or Helm:
//! every file parses; the chart's templates have balanced actions; the
//! chart's values satisfy `values.schema.json`; the example ElasticJobs
//! satisfy the CRD's own schema and the Rust-side validation; the RBAC is
//! least-privilege (no wildcards).

use std::path::{Path, PathBuf};

use ductile_operator::crd::ElasticJob;
use serde::Deserialize;
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("operator/ has a parent")
        .to_path_buf()
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

fn is_template(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "templates")
}

/// Every document of a multi-document YAML file, as JSON values.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn shipped_yaml() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = Vec::new();
    for dir in ["crds", "manifests", "charts"] {
        files_under(&root.join(dir), &mut files);
    }
    files.retain(|p| is_yaml(p) && !is_template(p));
    files
}

#[test]
fn every_yaml_file_parses() {
    let files = shipped_yaml();
    assert!(files.len() >= 6, "too few YAML files found: {files:?}");
    for path in files {
        let docs = documents(&path);
        assert!(!docs.is_empty(), "{} has no document", path.display());
        for doc in docs {
            assert!(
                doc.is_object(),
                "{}: a document is not a mapping",
                path.display()
            );
        }
    }
}

/// Helm templates are not YAML until rendered; check what can be checked
/// without Helm: balanced `{{ }}` and block actions.
#[test]
fn chart_templates_have_balanced_actions() {
    let mut files = Vec::new();
    files_under(&repo_root().join("charts/ductile/templates"), &mut files);
    assert!(files.iter().any(|p| p.ends_with("deployment.yaml")));
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let opens = text.matches("{{").count();
        let closes = text.matches("}}").count();
        assert_eq!(opens, closes, "{}: unbalanced {{{{ }}}}", path.display());
        let mut depth: i32 = 0;
        for action in text.split("{{").skip(1) {
            let body = action.split("}}").next().unwrap();
            let word = body
                .trim_start_matches('-')
                .split_whitespace()
                .next()
                .unwrap_or("");
            match word {
                "if" | "range" | "with" | "define" => depth += 1,
                "end" => depth -= 1,
                _ => {}
            }
            assert!(depth >= 0, "{}: `end` without a block", path.display());
        }
        assert_eq!(depth, 0, "{}: unclosed block", path.display());
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn errors(validator: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect()
}

#[test]
fn chart_values_satisfy_the_values_schema() {
    let chart = repo_root().join("charts/ductile");
    let schema = read_json(&chart.join("values.schema.json"));
    let validator = jsonschema::validator_for(&schema).expect("values.schema.json is a schema");
    let values = documents(&chart.join("values.yaml")).remove(0);
    let problems = errors(&validator, &values);
    assert!(problems.is_empty(), "values.yaml: {problems:#?}");

    // The schema rejects what it should: two replicas without leader election,
    // a port out of range, a misspelt key.
    let mut two_leaders = values.clone();
    two_leaders["replicaCount"] = 2.into();
    two_leaders["leaderElection"]["enabled"] = false.into();
    assert!(!validator.is_valid(&two_leaders));
    let mut bad_port = values.clone();
    bad_port["metrics"]["port"] = 70000.into();
    assert!(!validator.is_valid(&bad_port));
    let mut typo = values.clone();
    typo["replicas"] = 1.into();
    assert!(!validator.is_valid(&typo));
    // As a subchart it gets the parent's `global`.
    let mut subchart = values.clone();
    subchart["global"] = serde_json::json!({"imageRegistry": "r.example", "storageClass": "gp3"});
    let problems = errors(&validator, &subchart);
    assert!(problems.is_empty(), "global refused: {problems:#?}");
    // A standby by default, kept through drains, never on spot capacity.
    assert_eq!(values["replicaCount"], 2);
    assert_eq!(values["leaderElection"]["enabled"], true);
    assert_eq!(values["podDisruptionBudget"]["enabled"], true);
    assert_eq!(values["onDemandOnly"], true);
    let templates = chart.join("templates");
    let pdb = std::fs::read_to_string(templates.join("pdb.yaml")).unwrap();
    assert!(pdb.contains("kind: PodDisruptionBudget"));
    let deployment = std::fs::read_to_string(templates.join("deployment.yaml")).unwrap();
    for needed in [
        "eks.amazonaws.com/capacityType",
        "karpenter.sh/capacity-type",
        "podAntiAffinity",
    ] {
        assert!(
            deployment.contains(needed),
            "deployment.yaml lacks {needed}"
        );
    }
    let mut bad_budget = values.clone();
    bad_budget["metrics"]["prometheusRule"]["rescaleBudgetSeconds"] = "3".into();
    assert!(
        !validator.is_valid(&bad_budget),
        "a budget that is no histogram bucket"
    );
}

fn crd_schema() -> Value {
    let crd = documents(&repo_root().join("crds/elasticjob.yaml")).remove(0);
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn examples() -> Vec<(PathBuf, Value)> {
    let mut files = Vec::new();
    files_under(&repo_root().join("manifests/examples"), &mut files);
    files
        .into_iter()
        .filter(|p| is_yaml(p))
        .flat_map(|p| documents(&p).into_iter().map(move |d| (p.clone(), d)))
        .filter(|(_, d)| d["kind"] == "ElasticJob")
        .collect()
}

#[test]
fn example_elasticjobs_satisfy_the_crd_schema_and_validation() {
    let validator = jsonschema::validator_for(&crd_schema()).expect("the CRD schema compiles");
    let examples = examples();
    assert!(examples.len() >= 2, "expected a CPU and a GPU example");
    let mut gpu = false;
    for (path, doc) in examples {
        assert_eq!(
            doc["apiVersion"],
            "ductile.dev/v1alpha1",
            "{}",
            path.display()
        );
        let problems = errors(&validator, &doc);
        assert!(problems.is_empty(), "{}: {problems:#?}", path.display());
        let job: ElasticJob = serde_json::from_value(doc.clone())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Err(e) = job.spec.validate() {
            panic!("{}: {e}", path.display());
        }
        if doc.to_string().contains("nvidia.com/gpu") {
            gpu = true;
            // A job that asks for GPUs and runs its program on CPUs wastes them.
            let command = &doc["spec"]["template"]["spec"]["containers"][0]["command"];
            assert!(
                command
                    .as_array()
                    .is_some_and(|c| c.iter().any(|a| a == "--gpu")),
                "{}: asks for GPUs, but its command has no --gpu: {command}",
                path.display()
            );
        }
    }
    assert!(gpu, "no example asks for nvidia.com/gpu");
}

#[test]
fn the_crd_schema_rejects_bad_elasticjobs() {
    let validator = jsonschema::validator_for(&crd_schema()).unwrap();
    let (_, good) = examples().remove(0);
    for (field, value) in [
        ("pesPerPod", Value::from(0)),
        ("replicas", Value::from(0)),
        ("minReplicas", Value::from("two")),
    ] {
        let mut bad = good.clone();
        bad["spec"][field] = value;
        assert!(
            !validator.is_valid(&bad),
            "spec.{field} = {} accepted",
            bad["spec"][field]
        );
    }
    let mut bad_mode = good.clone();
    bad_mode["spec"]["rescalePolicy"]["rebalance"]["mode"] = "Sometimes".into();
    assert!(!validator.is_valid(&bad_mode));
    let mut no_template = good;
    no_template["spec"]
        .as_object_mut()
        .unwrap()
        .remove("template");
    assert!(!validator.is_valid(&no_template));
}

/// No `*` in any rule of the shipped RBAC; the jobs' rules are namespaced
/// Roles when the chart is given `watchNamespaces`. That the rules are
/// exactly the verbs the code calls is checked against the mock-API
/// scenarios (`the_rbac_grants_exactly_the_verbs_the_scenarios_use` in
/// `operator/src/k8s/tests/rbac.rs`), which also keeps install.yaml equal
/// to the chart.
#[test]
fn rbac_is_least_privilege() {
    let install = documents(&repo_root().join("manifests/install.yaml"));
    let roles: Vec<&Value> = install
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .collect();
    assert_eq!(roles.len(), 3, "nodes, jobs, leader election");
    for role in roles {
        for rule in role["rules"].as_array().unwrap() {
            for key in ["apiGroups", "resources", "verbs"] {
                for item in rule[key].as_array().unwrap() {
                    assert_ne!(
                        item, "*",
                        "wildcard in {key} of {}",
                        role["metadata"]["name"]
                    );
                }
            }
            // Secrets: read and create the job secret, nothing else.
            if rule["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r == "secrets")
            {
                assert_eq!(rule["verbs"], serde_json::json!(["get", "create"]));
            }
        }
    }
    let lease_role = install
        .iter()
        .find(|d| d["kind"] == "Role")
        .expect("install.yaml has the leader-election Role");
    assert_eq!(lease_role["rules"][0]["resources"][0], "leases");
    assert_eq!(lease_role["metadata"]["namespace"], "ductile-system");
    // The chart: a Role per watched namespace, a ClusterRole otherwise.
    let chart_rbac =
        std::fs::read_to_string(repo_root().join("charts/ductile/templates/rbac.yaml")).unwrap();
    let scoped = chart_rbac
        .split("{{- range .Values.watchNamespaces }}")
        .nth(1)
        .expect("the chart ranges over watchNamespaces")
        .split("{{- else }}")
        .next()
        .unwrap();
    assert!(scoped.contains("kind: Role\n") && scoped.contains("namespace: {{ . }}"));
    assert!(!scoped.contains("ClusterRole"), "{scoped}");
}

/// The install bundle's Deployment runs the operator binary with a
/// configuration the operator accepts, and the chart's template sets the
/// same variables.
#[test]
fn the_deployment_configures_the_operator_it_runs() {
    use ductile_operator::k8s::entry;
    let install = documents(&repo_root().join("manifests/install.yaml"));
    let deployment = install
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("install.yaml has the operator Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["command"],
        serde_json::json!(["ductile-operator"])
    );
    let env = container["env"].as_array().unwrap();
    let literal = |name: &str| {
        env.iter()
            .find(|v| v["name"] == name)
            .and_then(|v| v["value"].as_str().map(str::to_owned))
    };
    // Downward-API variables get a value on a cluster; stand one in here.
    let config = entry::OperatorConfig::from_lookup(|name| {
        literal(name).or_else(|| {
            env.iter()
                .any(|v| v["name"] == name && v["valueFrom"].is_object())
                .then(|| "from-downward-api".to_owned())
        })
    })
    .expect("the shipped configuration is accepted");
    assert!(config.leader_election);
    assert_eq!(config.identity, "from-downward-api");
    let port = container["ports"][0]["containerPort"].as_u64().unwrap();
    assert_eq!(u64::from(config.metrics.port()), port);
    assert_eq!(
        config.settings.coordinator_image,
        container["image"].as_str().unwrap(),
        "node 0's coordinator runs the operator's own image"
    );

    let template =
        std::fs::read_to_string(repo_root().join("charts/ductile/templates/deployment.yaml"))
            .unwrap();
    assert!(template.contains("command: [\"ductile-operator\"]"));
    for name in [
        entry::ENV_LEADER_ELECTION,
        entry::ENV_LEASE,
        entry::ENV_WATCH_NAMESPACES,
        entry::ENV_METRICS_PORT,
        entry::ENV_COORDINATOR_IMAGE,
        entry::ENV_NETWORK_POLICY,
        entry::ENV_POD_NAME,
        entry::ENV_POD_NAMESPACE,
    ] {
        assert!(
            template.contains(&format!("name: {name}")),
            "chart lacks {name}"
        );
        assert!(
            env.iter().any(|v| v["name"] == name),
            "install.yaml lacks {name}"
        );
    }
}

/// The target triple rustc builds for by default (`rustc -vV`'s `host:`).
fn host_triple() -> String {
    let out = std::process::Command::new(std::env::var("RUSTC").unwrap_or("rustc".into()))
        .arg("-vV")
        .output()
        .expect("rustc -vV runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names its host")
        .to_string()
}

/// `major.minor` of a version such as `1.89`, `1.89.0`.
fn minor_version(text: &str) -> (u32, u32) {
    let mut parts = text
        .trim()
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The workspace's `rust-version` is a true MSRV: at least what every
/// locked dependency declares it needs (`cargo metadata`), and every
/// Dockerfile builds with exactly that toolchain (a `FROM rust:X` stage or
/// a `RUST_TOOLCHAIN=X` argument). `cargo build --locked` in an image whose
/// toolchain is older than a locked crate's `rust-version` fails.
#[test]
fn dockerfiles_build_with_the_msrv_the_locked_crates_need() {
    let root = repo_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let msrv = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .map(|v| minor_version(v.trim_matches('"')))
        .expect("the workspace sets rust-version");

    // Offline, cargo has only the packages of platforms it built for: the
    // host's (Linux, as in the images). Without the filter it wants every
    // platform's crates (Windows' too) and fails on a fresh machine.
    let out = std::process::Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host_triple()])
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (needed, by) = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| {
            let v = p["rust_version"].as_str()?;
            Some((minor_version(v), format!("{} {}", p["name"], p["version"])))
        })
        .max()
        .expect("some crate declares a rust-version");
    assert!(
        msrv >= needed,
        "rust-version {msrv:?} is below what {by} needs ({needed:?})"
    );

    let mut dockerfiles = Vec::new();
    for entry in std::fs::read_dir(root.join("docker")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) == Some("Dockerfile") {
            dockerfiles.push(path);
        }
    }
    assert!(
        dockerfiles.len() >= 3,
        "operator, apps, apps-cuda: {dockerfiles:?}"
    );
    for path in dockerfiles {
        let text = std::fs::read_to_string(&path).unwrap();
        let toolchains: Vec<(u32, u32)> = text
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let v = l
                    .strip_prefix("FROM rust:")
                    .or_else(|| l.strip_prefix("ARG RUST_TOOLCHAIN="))?;
                Some(minor_version(v.split(['-', ' ']).next().unwrap_or("")))
            })
            .collect();
        assert!(
            !toolchains.is_empty(),
            "{}: no Rust toolchain named",
            path.display()
        );
        for toolchain in toolchains {
            assert_eq!(
                toolchain,
                msrv,
                "{}: toolchain vs rust-version",
                path.display()
            );
        }
        // Multi-stage, non-root: the toolchain stays out of the final image.
        assert!(
            text.matches("\nFROM ").count() >= 2,
            "{}: one stage",
            path.display()
        );
        let last_user = text
            .lines()
            .filter_map(|l| l.strip_prefix("USER "))
            .last()
            .unwrap_or("");
        assert!(
            !last_user.is_empty() && !last_user.starts_with('0') && !last_user.starts_with("root"),
            "{}: runs as root",
            path.display()
        );
    }
}
