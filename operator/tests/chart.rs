//! The Helm chart, rendered without Helm (`support/helm.rs`: the template
//! features the chart uses, an error for any other) and checked as a
//! cluster would see it: every rendering with the defaults and with every
//! optional feature on satisfies the values schema, parses, passes
//! `kubernetes-validate` for Kubernetes 1.30 and 1.35, grants no RBAC the
//! operator does not need (compared with the install bundle, whose rules a
//! unit test derives from the mock-API scenarios), configures an operator
//! that accepts its configuration, and with the defaults is the install
//! bundle, object for object.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{json, Value};

#[path = "support/helm.rs"]
mod helm;
#[path = "support/kubernetes_validate.rs"]
mod kubernetes_validate;

use helm::{Chart, Object, Release};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("operator/ has a parent")
        .to_path_buf()
}

fn chart_dir() -> PathBuf {
    repo_root().join("charts/ductile")
}

fn chart() -> Chart {
    Chart::load(&chart_dir()).unwrap_or_else(|e| panic!("the chart does not load: {e}"))
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

// ------------------------------------------------------------ renderings

/// One way to install the chart: a release and values over the defaults.
struct Case {
    name: &'static str,
    release: Release,
    overrides: Value,
}

fn release(name: &str, namespace: &str) -> Release {
    Release {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
    }
}

/// The renderings every check runs on: the defaults (as install.yaml was
/// written: release `ductile` in `ductile-system`), every optional feature
/// on, a minimal single replica, a custom affinity.
fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "defaults",
            release: release("ductile", "ductile-system"),
            overrides: json!({}),
        },
        Case {
            name: "every-feature",
            release: release("prod", "ops"),
            overrides: every_feature(),
        },
        Case {
            name: "minimal",
            release: release("ductile-operator", "ductile"),
            overrides: json!({
                "replicaCount": 1,
                "leaderElection": {"enabled": false},
                "metrics": {"enabled": false},
                "serviceAccount": {"create": false, "name": "ops-robot"},
                "onDemandOnly": false,
            }),
        },
        Case {
            name: "custom-affinity",
            release: release("hpc", "hpc-system"),
            overrides: json!({
                "replicaCount": 3,
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "node-role", "operator": "In", "values": ["ops"]}]}]}}},
                "watchNamespaces": ["hpc"],
            }),
        },
    ]
}

/// Every optional feature of values.yaml on, and every list and map that
/// the templates copy with `toYaml` given something to copy.
fn every_feature() -> Value {
    json!({
        "image": {"tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry"}],
        "networkPolicy": {"enabled": true},
        "logLevel": "debug,kube=info",
        "watchNamespaces": ["hpc", "ml"],
        "serviceAccount": {"annotations": {
            "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/ductile"}},
        "metrics": {
            "port": 9090,
            "serviceMonitor": {"enabled": true, "interval": "15s", "labels": {"release": "kube-prometheus"}},
            "podMonitor": {"enabled": true, "labels": {"release": "kube-prometheus"}},
            "prometheusRule": {"enabled": true, "labels": {"release": "kube-prometheus"},
                "rescaleBudgetSeconds": "2", "noticeDeadlineSeconds": "90"},
            "dashboard": {"enabled": true, "labels": {"grafana_dashboard": "1", "team": "hpc"}},
        },
        "podAnnotations": {"example.com/owner": "hpc-team"},
        "podLabels": {"team": "hpc"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "global": {"imageRegistry": "registry.example"},
    })
}

/// A rendering: its values and objects.
struct Rendering {
    name: &'static str,
    release: Release,
    values: Value,
    objects: Vec<Object>,
    notes: String,
    /// Each template's rendered text, as `helm template` prints it.
    files: BTreeMap<String, String>,
}

fn render(chart: &Chart, case: Case) -> Rendering {
    let values = helm::merge(&chart.default_values, &case.overrides);
    let rendered = chart
        .render(&case.release, &values)
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let objects = rendered
        .objects()
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    Rendering {
        name: case.name,
        release: case.release,
        values,
        objects,
        notes: rendered.notes.clone().expect("the chart has NOTES.txt"),
        files: rendered.files,
    }
}

fn renderings() -> Vec<Rendering> {
    let chart = chart();
    cases().into_iter().map(|c| render(&chart, c)).collect()
}

impl Rendering {
    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.objects
            .iter()
            .map(|o| &o.value)
            .filter(|v| v["kind"] == kind)
            .collect()
    }

    fn one(&self, kind: &str) -> &Value {
        match self.of_kind(kind).as_slice() {
            [one] => one,
            other => panic!(
                "{}: {} {kind} objects, expected one",
                self.name,
                other.len()
            ),
        }
    }

    fn fullname(&self) -> String {
        self.one("Deployment")["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn object_values(&self) -> Vec<Value> {
        self.objects.iter().map(|o| o.value.clone()).collect()
    }
}

// ------------------------------------------------------------ the renderer

fn render_text(templates: &[(&str, &str)], values: Value) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("templates")).unwrap();
    std::fs::write(
        dir.path().join("Chart.yaml"),
        "apiVersion: v2\nname: demo\nversion: 0.2.0\nappVersion: \"1.0\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("values.yaml"),
        serde_yaml::to_string(&values).unwrap(),
    )
    .unwrap();
    for (name, text) in templates {
        std::fs::write(dir.path().join("templates").join(name), text).unwrap();
    }
    let chart = Chart::load(dir.path()).map_err(|e| e.to_string())?;
    let rendered = chart
        .render(&release("rel", "ns"), &chart.default_values)
        .map_err(|e| e.to_string())?;
    Ok(rendered.files["templates/t.yaml"].clone())
}

/// Each feature the chart's templates use renders as Helm renders it.
#[test]
fn the_renderer_renders_the_go_template_features_the_chart_uses() {
    let values = json!({
        "on": true, "off": false, "empty": {}, "list": ["a", "b"], "port": 8080,
        "tag": "", "labels": {"b": "2", "a": "x y"}, "n": "3",
    });
    let case = |template: &str, expected: &str| {
        let got = render_text(
            &[
                ("_helpers.tpl", "{{- define \"demo.name\" -}}\n{{ .Chart.Name }}-{{ .Release.Name }}\n{{- end -}}"),
                ("t.yaml", template),
            ],
            values.clone(),
        )
        .unwrap_or_else(|e| panic!("{template:?}: {e}"));
        assert_eq!(got, expected, "{template:?}");
    };
    // Trim markers take every space and newline on their side.
    case("a:\n  {{- \" b\" }}  \n  {{- /* note */ -}}\n  c", "a: bc");
    case("x: {{ .Values.port }}", "x: 8080");
    case("x: {{ .Values.port | quote }}", "x: \"8080\"");
    case("x: {{ .Values.on | quote }}", "x: \"true\"");
    case("{{ include \"demo.name\" . }}", "demo-rel");
    case("{{ include \"demo.name\" $ | nindent 2 }}", "\n  demo-rel");
    case("{{ if .Values.on }}y{{ else }}n{{ end }}", "y");
    case(
        "{{ if .Values.off }}y{{ else if .Values.list }}l{{ else }}n{{ end }}",
        "l",
    );
    case(
        "{{ if and .Values.on (ge (int .Values.n) 2) }}y{{ end }}",
        "y",
    );
    case(
        "{{ if or .Values.off (lt (int .Values.n) 2) }}y{{ else }}n{{ end }}",
        "n",
    );
    case("{{ if not .Values.empty }}empty{{ end }}", "empty");
    case("{{ with .Values.labels }}{{ .a }}{{ end }}", "x y");
    case(
        "{{ with .Values.empty }}set{{ else }}unset{{ end }}",
        "unset",
    );
    case(
        "{{ range .Values.list }}[{{ . }}/{{ $.Release.Namespace }}]{{ end }}",
        "[a/ns][b/ns]",
    );
    case("{{ range .Values.empty }}x{{ else }}none{{ end }}", "none");
    case(
        "l:\n  {{- toYaml .Values.labels | nindent 2 }}",
        "l:\n  a: x y\n  b: '2'",
    );
    case("l: {{ toYaml .Values.list | indent 1 }}", "l:  - a\n - b");
    case("{{ .Values.tag | default .Chart.AppVersion }}", "1.0");
    case("{{ default \"d\" .Values.n }}", "3");
    case(
        "{{ printf \"%s-%s\" .Chart.Name .Chart.Version | trunc 6 | trimSuffix \"-\" }}",
        "demo-0",
    );
    case("{{ if contains \"de\" .Chart.Name }}y{{ end }}", "y");
    case("{{ join \",\" .Values.list | quote }}", "\"a,b\"");
    case("{{ \"{{\" }} $labels.x {{ \"}}\" }}", "{{ $labels.x }}");
    case(
        "{{ .Release.Service }} {{ if eq .Values.n \"3\" }}eq{{ end }}",
        "Helm eq",
    );
}

/// What the renderer does not know fails the test, naming it, instead of
/// rendering something Helm would render differently.
#[test]
fn the_renderer_refuses_what_it_does_not_know() {
    let values = json!({"metrics": {"enabled": true}, "big": 1000000, "map": {"a": 1}});
    for (template, expected) in [
        (
            "{{ .Values.metrics.enbled }}",
            "metrics.enbled does not exist",
        ),
        (
            "{{ if .Values.metrcs.enabled }}x{{ end }}",
            "metrcs does not exist",
        ),
        (
            "{{ lookup \"v1\" \"Secret\" \"ns\" \"s\" }}",
            "unknown function or keyword `lookup`",
        ),
        ("{{ tpl .Values.x . }}", "`tpl`"),
        ("{{ $x := 1 }}", "only `$` is supported"),
        (
            "{{ template \"demo.name\" . }}",
            "`template` action is not supported",
        ),
        ("{{ if .Values.metrics.enabled }}x", "without `end`"),
        ("x{{ end }}", "`end` without a block"),
        ("{{ include \"nope\" . }}", "no template defines"),
        ("{{ .Values.big }}", "exponent form"),
        ("{{ .Values.map }}", "use toYaml"),
        ("{{ .Files.Get \"missing.json\" }}", "missing.json"),
        (
            "{{ .Capabilities.KubeVersion }}",
            "Capabilities does not exist",
        ),
        ("{{ \"x\" | upper }}", "`upper`"),
        ("{{ .Values.metrics.enabled", "unclosed action"),
        (
            "{{ if (not .Values.metrics.enabled }}x{{ end }}",
            "unbalanced `(`",
        ),
        ("{{ not .Values.metrics.enabled) }}", "unbalanced `)`"),
        ("{{ (.Values.map).a }}", "`(...).Field`"),
    ] {
        let err = render_text(&[("t.yaml", template)], values.clone())
            .expect_err(&format!("{template:?} rendered"));
        assert!(err.contains(expected), "{template:?}: {err}");
    }
}

/// A template that renders something that is not YAML, or an object
/// without a kind, is an error too (Helm refuses to install it).
#[test]
fn a_rendering_that_is_not_kubernetes_yaml_is_refused() {
    for (text, expected) in [
        ("a: [1, 2\n", "does not parse"),
        ("apiVersion: v1\nmetadata: {name: x}\n", "without kind"),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
            "without metadata.name",
        ),
    ] {
        let rendered = helm::Rendered {
            files: BTreeMap::from([("templates/t.yaml".to_owned(), text.to_owned())]),
            notes: None,
        };
        let err = rendered.objects().expect_err(text).to_string();
        assert!(err.contains(expected), "{text:?}: {err}");
    }
}

// ------------------------------------------------------------ values, Kubernetes schemas

/// Every rendering's values satisfy values.schema.json (Helm checks them
/// before it renders), and every rendering renders, NOTES.txt included.
#[test]
fn every_rendering_has_valid_values_and_renders() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).expect("values.schema.json is a schema");
    for r in renderings() {
        let problems: Vec<String> = validator
            .iter_errors(&r.values)
            .map(|e| format!("{e} at {}", e.instance_path))
            .collect();
        assert!(problems.is_empty(), "{}: {problems:#?}", r.name);
        keep(&r, &repo_root().join("target/chart-render"));
        assert!(
            r.objects.len() >= 5,
            "{}: {} objects",
            r.name,
            r.objects.len()
        );
        assert!(
            r.notes
                .contains(&format!("namespace {}", r.release.namespace)),
            "{}",
            r.notes
        );
        let single = r.values["replicaCount"] == 1;
        assert_eq!(
            r.notes.contains("One replica"),
            single,
            "{}: {}",
            r.name,
            r.notes
        );
        // Names are unique per kind and namespace, as the API server needs.
        let mut seen = BTreeSet::new();
        for o in &r.objects {
            let key = (
                o.value["kind"].to_string(),
                o.value["metadata"]["namespace"].to_string(),
                o.value["metadata"]["name"].to_string(),
            );
            assert!(seen.insert(key.clone()), "{}: {key:?} twice", r.name);
        }
    }
}

/// Writes a rendering under `root`/NAME/ (target/chart-render/ for a reader), as
/// `helm template` would print it, with its release and values (what
/// `go_template_renders_what_the_test_renderer_renders` renders again).
fn keep(r: &Rendering, root: &Path) -> PathBuf {
    let out = root.join(r.name);
    let notes = ("templates/NOTES.txt".to_owned(), r.notes.clone());
    for (file, text) in r.files.iter().chain([(&notes.0, &notes.1)]) {
        let path = out.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
    let release = json!({"name": r.release.name, "namespace": r.release.namespace});
    std::fs::write(out.join("release.json"), release.to_string()).unwrap();
    std::fs::write(out.join("values.json"), r.values.to_string()).unwrap();
    out
}

/// The test renderer agrees with Go's own `text/template` and Sprig, set
/// up as Helm's engine sets them up (`support/gotemplate/main.go`), on
/// every rendering: the same objects from every template, the same
/// NOTES.txt. Ignored by a plain `cargo test`: it needs Go and Sprig
/// (Debian: golang-go, golang-github-masterminds-sprig-dev,
/// golang-gopkg-yaml.v2-dev; `GOPATH` defaults to Debian's
/// /usr/share/gocode). Run it with `--ignored go_template`.
#[test]
#[ignore = "needs Go and Sprig: --ignored go_template"]
fn go_template_renders_what_the_test_renderer_renders() {
    let root = repo_root();
    let bin = root.join("target/chart-render/go-template-render");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    let gopath = std::env::var("GOPATH").unwrap_or_else(|_| "/usr/share/gocode".to_owned());
    let built = std::process::Command::new("go")
        .current_dir(&root)
        .env("GO111MODULE", "off")
        .env("GOPATH", gopath)
        // Pure Go (no C compiler needed), its cache under target/.
        .env("CGO_ENABLED", "0")
        .env("GOCACHE", root.join("target/go-cache"))
        .arg("build")
        .arg("-o")
        .arg(&bin)
        .arg("operator/tests/support/gotemplate/main.go")
        .status()
        .unwrap_or_else(|e| {
            panic!("go: {e}; install golang-go and golang-github-masterminds-sprig-dev")
        });
    assert!(built.success(), "go build of support/gotemplate failed");
    let mut identical = 0;
    let mut files = 0;
    let cases = tempfile::tempdir().unwrap();
    for r in renderings() {
        let case = keep(&r, cases.path());
        let out = case.join("go");
        let _ = std::fs::remove_dir_all(&out);
        let status = std::process::Command::new(&bin)
            .arg(chart_dir())
            .arg(&case)
            .arg(&out)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "{}: Go's text/template refused the chart",
            r.name
        );
        let notes = ("templates/NOTES.txt".to_owned(), r.notes.clone());
        for (file, ours) in r.files.iter().chain([(&notes.0, &notes.1)]) {
            let theirs = std::fs::read_to_string(out.join(file))
                .unwrap_or_else(|e| panic!("{}: Go rendered no {file}: {e}", r.name));
            files += 1;
            if theirs == *ours {
                identical += 1;
                continue;
            }
            // toYaml quotes differently ('1' here, "1" in Go): compare objects.
            let parse = |text: &str| -> Vec<Value> {
                serde_yaml::Deserializer::from_str(text)
                    .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{file}: {e}")))
                    .filter(|v| !v.is_null())
                    .collect()
            };
            assert!(
                file.ends_with(".yaml"),
                "{}: {file} differs:\n{theirs}\n---\n{ours}",
                r.name
            );
            assert_eq!(parse(&theirs), parse(ours), "{}: {file}", r.name);
        }
    }
    eprintln!(
        "{identical} of {files} rendered files byte-identical to Go's, the rest equal as YAML"
    );
}

/// `kubeVersion` in Chart.yaml admits both versions the objects are validated for.
#[test]
fn the_chart_admits_the_kubernetes_versions_it_is_validated_for() {
    let chart = chart();
    let constraint = chart.metadata()["KubeVersion"]
        .as_str()
        .expect("Chart.yaml sets kubeVersion");
    let floor = constraint
        .strip_prefix(">=")
        .and_then(|v| v.strip_suffix("-0"))
        .unwrap_or_else(|| {
            panic!("kubeVersion {constraint:?}: only `>=X.Y.Z-0` is understood here")
        });
    let parse = |v: &str| -> Vec<u32> { v.split('.').map(|p| p.parse().unwrap()).collect() };
    assert_eq!(
        parse(floor),
        parse(kubernetes_validate::VERSIONS[0]),
        "validated at the floor"
    );
    for version in kubernetes_validate::VERSIONS {
        assert!(
            parse(version) >= parse(floor),
            "{version} below {constraint}"
        );
    }
}

/// Kinds `kubernetes-validate` has no schema for (the Prometheus Operator's
/// CRDs), and why they are not validated here.
const NO_SCHEMA: &[(&str, &str)] = &[
    (
        "ServiceMonitor",
        "a Prometheus Operator CRD: kubernetes-validate bundles only the core API",
    ),
    (
        "PodMonitor",
        "a Prometheus Operator CRD: kubernetes-validate bundles only the core API",
    ),
    (
        "PrometheusRule",
        "a Prometheus Operator CRD: kubernetes-validate bundles only the core API",
    ),
];

/// Every rendered object of every rendering passes `kubernetes-validate`,
/// strict, for 1.30 and 1.35, except the Prometheus Operator's kinds, which
/// are skipped with a reason (and checked for what they select in
/// `the_optional_features_render_what_they_promise`).
#[test]
fn every_rendered_object_passes_kubernetes_validate() {
    let root = repo_root();
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let mut skipped = BTreeSet::new();
    for r in renderings() {
        let mut text = String::new();
        for o in &r.objects {
            let kind = o.value["kind"].as_str().unwrap();
            if let Some((_, why)) = NO_SCHEMA.iter().find(|(k, _)| *k == kind) {
                assert_eq!(
                    o.value["apiVersion"], "monitoring.coreos.com/v1",
                    "{}",
                    o.file
                );
                eprintln!(
                    "{}: {kind} {} not validated: {why}",
                    r.name, o.value["metadata"]["name"]
                );
                skipped.insert(kind.to_owned());
                continue;
            }
            text.push_str("---\n");
            text.push_str(&serde_yaml::to_string(&o.value).unwrap());
        }
        let path = dir.path().join(format!("{}.yaml", r.name));
        std::fs::write(&path, text).unwrap();
        files.push(path);
    }
    // The every-feature rendering has each of them: none went unrendered.
    let expected: BTreeSet<String> = NO_SCHEMA.iter().map(|(k, _)| (*k).to_owned()).collect();
    assert_eq!(skipped, expected);
    let files: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    for version in kubernetes_validate::VERSIONS {
        match kubernetes_validate::validate(&root, version, &files) {
            Ok(report) => assert!(
                !report.contains("WARN"),
                "kubernetes-validate -k {version} warned (a kind without a schema?):\n{report}"
            ),
            Err(report) => panic!("{report}"),
        }
    }
}

/// The validation can fail: a misspelt field of a rendered Deployment is
/// refused for both versions.
#[test]
fn kubernetes_validate_refuses_a_broken_rendering() {
    let r = render(&chart(), cases().remove(0));
    let mut deployment = r.one("Deployment").clone();
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = json!("Always");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.yaml");
    std::fs::write(&path, serde_yaml::to_string(&deployment).unwrap()).unwrap();
    for version in kubernetes_validate::VERSIONS {
        let report = kubernetes_validate::validate(&repo_root(), version, &[&path])
            .expect_err("a misspelt field passed");
        assert!(report.contains("imagePullPolicyy"), "{report}");
    }
}

// ------------------------------------------------------------ RBAC

/// (API group, resource, verb).
type Grant = (String, String, String);

/// What the operator needs, per role of the chart. The install bundle's
/// rules are the source of truth: `the_rbac_grants_exactly_the_verbs_the_scenarios_use`
/// (operator/src/k8s/tests/rbac.rs) derives the calls from the mock-API
/// scenarios and compares them with the chart's rule bodies both ways, and
/// `the_install_bundle_grants_what_the_chart_grants` keeps install.yaml
/// equal to them.
struct Needs {
    nodes: BTreeSet<Grant>,
    jobs: BTreeSet<Grant>,
    leases: BTreeSet<Grant>,
    /// Added to the jobs' rules with networkPolicy.enabled (not in the
    /// bundle, whose defaults leave it off; the same unit test derives
    /// these from the `with_network_policies_every_job_gets_one` scenario).
    network_policies: BTreeSet<Grant>,
}

fn grant(g: &str, r: &str, v: &str) -> Grant {
    (g.to_owned(), r.to_owned(), v.to_owned())
}

/// The grants of a rule list, and what is wrong with its shape: wildcards,
/// non-resource URLs, resource names, unknown keys.
fn grants_of(rules: &Value, role: &str, problems: &mut Vec<String>) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    let Some(rules) = rules.as_array() else {
        problems.push(format!("{role}: rules is not a list"));
        return out;
    };
    for rule in rules {
        if let Some(map) = rule.as_object() {
            for key in map.keys() {
                if !["apiGroups", "resources", "verbs"].contains(&key.as_str()) {
                    problems.push(format!("{role}: a rule with {key} ({rule})"));
                }
            }
        }
        let list = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|v| v.as_str().unwrap_or("?").to_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        for group in list("apiGroups") {
            for resource in list("resources") {
                for verb in list("verbs") {
                    if group == "*" || resource == "*" || verb == "*" {
                        problems.push(format!("{role}: wildcard in {rule}"));
                    }
                    out.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    out
}

fn needs() -> Needs {
    let bundle = documents(&repo_root().join("manifests/install.yaml"));
    let rules = |kind: &str, name: &str| {
        let role = bundle
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("install.yaml has no {kind} {name}"));
        let mut problems = Vec::new();
        let grants = grants_of(&role["rules"], name, &mut problems);
        assert!(problems.is_empty(), "install.yaml: {problems:?}");
        grants
    };
    Needs {
        nodes: rules("ClusterRole", "ductile-nodes"),
        jobs: rules("ClusterRole", "ductile-jobs"),
        leases: rules("Role", "ductile-leader-election"),
        network_policies: BTreeSet::from([
            grant("networking.k8s.io", "networkpolicies", "create"),
            grant("networking.k8s.io", "networkpolicies", "patch"),
        ]),
    }
}

/// What a rendering's RBAC should be, from its release and values.
struct Expect {
    fullname: String,
    namespace: String,
    service_account: String,
    watch: Vec<String>,
    leader_election: bool,
    network_policy: bool,
}

impl Expect {
    fn of(r: &Rendering) -> Expect {
        let v = &r.values;
        let fullname = r.fullname();
        let sa_name = v["serviceAccount"]["name"].as_str().unwrap_or("");
        let service_account = match (v["serviceAccount"]["create"].as_bool(), sa_name) {
            (Some(true), "") => fullname.clone(),
            (Some(false), "") => "default".to_owned(),
            (_, name) => name.to_owned(),
        };
        Expect {
            fullname,
            namespace: r.release.namespace.clone(),
            service_account,
            watch: serde_json::from_value(v["watchNamespaces"].clone()).unwrap(),
            leader_election: v["leaderElection"]["enabled"] == true,
            network_policy: v["networkPolicy"]["enabled"] == true,
        }
    }
}

/// Everything wrong with a rendering's RBAC: a grant the operator does not
/// need (an over-grant), one it needs and lacks, a role of the wrong scope
/// (a ClusterRole for the jobs when namespaces are given), a binding to a
/// role the chart does not render (`cluster-admin`), a subject other than
/// the operator's ServiceAccount.
fn rbac_problems(objects: &[Value], needs: &Needs, expect: &Expect) -> Vec<String> {
    let mut problems = Vec::new();
    let f = &expect.fullname;
    let mut jobs = needs.jobs.clone();
    if expect.network_policy {
        jobs.extend(needs.network_policies.iter().cloned());
    }
    // (kind, namespace, name) of every role the operator needs, with its grants.
    let mut wanted: BTreeMap<(String, Option<String>, String), &BTreeSet<Grant>> = BTreeMap::new();
    wanted.insert(
        ("ClusterRole".into(), None, format!("{f}-nodes")),
        &needs.nodes,
    );
    if expect.watch.is_empty() {
        wanted.insert(("ClusterRole".into(), None, format!("{f}-jobs")), &jobs);
    } else {
        for ns in &expect.watch {
            wanted.insert(
                ("Role".into(), Some(ns.clone()), format!("{f}-jobs")),
                &jobs,
            );
        }
    }
    if expect.leader_election {
        wanted.insert(
            (
                "Role".into(),
                Some(expect.namespace.clone()),
                format!("{f}-leader-election"),
            ),
            &needs.leases,
        );
    }
    let key = |o: &Value, kind: &str| {
        (
            kind.to_owned(),
            o["metadata"]["namespace"].as_str().map(str::to_owned),
            o["metadata"]["name"].as_str().unwrap_or("?").to_owned(),
        )
    };
    let mut roles = BTreeSet::new();
    for o in objects {
        let kind = o["kind"].as_str().unwrap_or("");
        if kind != "Role" && kind != "ClusterRole" {
            continue;
        }
        let k = key(o, kind);
        roles.insert(k.clone());
        if o.get("aggregationRule").is_some() {
            problems.push(format!(
                "{k:?}: an aggregationRule pulls in other roles' grants"
            ));
        }
        let granted = grants_of(&o["rules"], &k.2, &mut problems);
        let Some(needed) = wanted.get(&k) else {
            problems.push(format!(
                "{k:?}: a role the operator does not need, granting {granted:?}"
            ));
            continue;
        };
        for g in granted.difference(needed) {
            problems.push(format!(
                "{k:?} grants {g:?}, which the operator does not need"
            ));
        }
        for g in needed.difference(&granted) {
            problems.push(format!("{k:?} lacks {g:?}, which the operator calls"));
        }
    }
    for k in wanted.keys() {
        if !roles.contains(k) {
            problems.push(format!("no {k:?}: the operator needs it"));
        }
    }
    // Bindings: each of the chart's roles bound once, to the operator's
    // ServiceAccount only; nothing else bound.
    let mut bound = BTreeSet::new();
    for o in objects {
        let kind = o["kind"].as_str().unwrap_or("");
        let role_kind = match kind {
            "RoleBinding" => "Role",
            "ClusterRoleBinding" => "ClusterRole",
            _ => continue,
        };
        let b = key(o, kind);
        let role_ref = &o["roleRef"];
        let target = (
            role_ref["kind"].as_str().unwrap_or("?").to_owned(),
            if role_ref["kind"] == "Role" {
                b.1.clone()
            } else {
                None
            },
            role_ref["name"].as_str().unwrap_or("?").to_owned(),
        );
        if role_ref["apiGroup"] != "rbac.authorization.k8s.io" || target.0 != role_kind {
            problems.push(format!(
                "{b:?}: roleRef {role_ref} (a {kind} binds a {role_kind} here)"
            ));
        }
        if !roles.contains(&target) {
            problems.push(format!(
                "{b:?} binds {target:?}, which the chart does not render"
            ));
        }
        if !bound.insert(target.clone()) {
            problems.push(format!("{target:?} bound twice"));
        }
        let subject = json!([{
            "kind": "ServiceAccount",
            "name": expect.service_account,
            "namespace": expect.namespace,
        }]);
        if o["subjects"] != subject {
            problems.push(format!(
                "{b:?}: subjects {} instead of {subject}",
                o["subjects"]
            ));
        }
    }
    for k in &roles {
        if !bound.contains(k) {
            problems.push(format!("{k:?} is bound to nobody"));
        }
    }
    problems
}

/// Every rendering grants exactly what the operator needs for its values:
/// no more (no wildcard, no extra verb, no cluster-wide job role when
/// namespaces are given), no less.
#[test]
fn every_rendering_grants_exactly_what_the_operator_needs() {
    let needs = needs();
    for r in renderings() {
        let problems = rbac_problems(&r.object_values(), &needs, &Expect::of(&r));
        assert!(problems.is_empty(), "{}: {problems:#?}", r.name);
    }
}

/// The checker fails on over-grants: a wildcard, an extra verb, an extra
/// resource, a binding to `cluster-admin`, an extra subject, a cluster-wide
/// job role with watchNamespaces; and on a missing verb.
#[test]
fn the_rbac_check_catches_over_grants() {
    let needs = needs();
    let r = render(&chart(), cases().remove(0));
    let expect = Expect::of(&r);
    let base = r.object_values();
    assert!(rbac_problems(&base, &needs, &expect).is_empty());
    let role_index = |name: &str| {
        base.iter()
            .position(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == name)
            .unwrap()
    };
    let jobs = role_index("ductile-jobs");
    let secrets_rule = base[jobs]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .position(|r| r["resources"] == json!(["secrets"]))
        .unwrap();
    let mutations: Vec<(&str, Box<dyn Fn(&mut Vec<Value>)>)> = vec![
        (
            "wildcard verb",
            Box::new(move |o| o[jobs]["rules"][0]["verbs"] = json!(["*"])),
        ),
        (
            "wildcard resource",
            Box::new(move |o| o[jobs]["rules"][1]["resources"] = json!(["*"])),
        ),
        (
            "extra verb on secrets",
            Box::new(move |o| {
                o[jobs]["rules"][secrets_rule]["verbs"] = json!(["get", "create", "list"])
            }),
        ),
        (
            "extra resource",
            Box::new(move |o| {
                o[jobs]["rules"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}))
            }),
        ),
        (
            "non-resource URLs",
            Box::new(move |o| {
                o[jobs]["rules"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}))
            }),
        ),
        (
            "binding to cluster-admin",
            Box::new(|o| {
                let b = o
                    .iter_mut()
                    .find(|b| b["kind"] == "ClusterRoleBinding")
                    .unwrap();
                b["roleRef"]["name"] = json!("cluster-admin");
            }),
        ),
        (
            "extra subject",
            Box::new(|o| {
                let b = o
                    .iter_mut()
                    .find(|b| b["kind"] == "ClusterRoleBinding")
                    .unwrap();
                b["subjects"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"}));
            }),
        ),
        (
            "missing verb",
            Box::new(move |o| o[jobs]["rules"][secrets_rule]["verbs"] = json!(["get"])),
        ),
    ];
    for (what, mutate) in mutations {
        let mut objects = base.clone();
        mutate(&mut objects);
        let problems = rbac_problems(&objects, &needs, &expect);
        assert!(!problems.is_empty(), "{what} passed the check");
    }
    // The defaults' cluster-wide job role is an over-grant for an operator
    // told to watch one namespace.
    let scoped = Expect {
        watch: vec!["hpc".to_owned()],
        ..Expect::of(&r)
    };
    let problems = rbac_problems(&base, &needs, &scoped);
    assert!(
        problems.iter().any(|p| p.contains("does not need")),
        "{problems:#?}"
    );
}

/// The whole path catches an over-grant written into the chart itself: a
/// copy of the chart whose rbac.yaml adds a verb, or a `*`, renders to
/// RBAC the check refuses.
#[test]
fn an_over_grant_in_the_chart_fails_the_check() {
    let needs = needs();
    let source = std::fs::read_to_string(chart_dir().join("templates/rbac.yaml")).unwrap();
    let secrets = "verbs: [\"get\", \"create\"]";
    assert_eq!(
        source.matches(secrets).count(),
        1,
        "rbac.yaml's secrets rule moved"
    );
    for edited in [
        source.replace(secrets, "verbs: [\"get\", \"create\", \"list\", \"watch\"]"),
        source.replace("verbs: [\"list\", \"watch\"]", "verbs: [\"*\"]"),
    ] {
        let copy = tempfile::tempdir().unwrap();
        copy_dir(&chart_dir(), copy.path());
        std::fs::write(copy.path().join("templates/rbac.yaml"), edited).unwrap();
        let chart = Chart::load(copy.path()).unwrap();
        let r = render(&chart, cases().remove(0));
        let problems = rbac_problems(&r.object_values(), &needs, &Expect::of(&r));
        assert!(
            problems
                .iter()
                .any(|p| p.contains("does not need") || p.contains("wildcard")),
            "{problems:#?}"
        );
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

// ------------------------------------------------------------ the install bundle, the operator

/// With its defaults the chart renders what manifests/install.yaml holds,
/// object for object (the bundle adds the Namespace and keeps fewer
/// labels): the Deployment's image, command, environment, ports, probes,
/// resources, security contexts and affinity, the Service, the PDB, the
/// RBAC.
#[test]
fn the_default_rendering_is_the_install_bundle() {
    let r = render(&chart(), cases().remove(0));
    let bundle = documents(&repo_root().join("manifests/install.yaml"));
    let id = |o: &Value| {
        format!(
            "{} {}/{}",
            o["kind"].as_str().unwrap_or("?"),
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap_or("?")
        )
    };
    let without_labels = |o: &Value| {
        let mut o = o.clone();
        o["metadata"].as_object_mut().unwrap().remove("labels");
        o
    };
    let rendered: BTreeMap<String, &Value> =
        r.objects.iter().map(|o| (id(&o.value), &o.value)).collect();
    let mut problems = Vec::new();
    let mut matched = BTreeSet::new();
    for b in bundle.iter().filter(|b| b["kind"] != "Namespace") {
        let Some(o) = rendered.get(&id(b)) else {
            problems.push(format!("the chart does not render {}", id(b)));
            continue;
        };
        matched.insert(id(b));
        if without_labels(o) != without_labels(b) {
            problems.push(format!(
                "{} differs:\nchart:  {}\nbundle: {}",
                id(b),
                without_labels(o),
                without_labels(b)
            ));
        }
        if let Some(labels) = b["metadata"]["labels"].as_object() {
            for (k, v) in labels {
                if o["metadata"]["labels"][k] != *v {
                    problems.push(format!("{}: label {k}={v} in the bundle only", id(b)));
                }
            }
        }
    }
    for name in rendered.keys() {
        if !matched.contains(name) {
            problems.push(format!("the bundle lacks {name}"));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Every rendering's Deployment configures an operator that accepts its
/// configuration, and the configuration is what the values say.
#[test]
fn every_rendering_configures_an_operator_that_accepts_it() {
    use ductile_operator::k8s::entry::OperatorConfig;
    for r in renderings() {
        let deployment = r.one("Deployment");
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        assert_eq!(
            container["command"],
            json!(["ductile-operator"]),
            "{}",
            r.name
        );
        let env = container["env"].as_array().unwrap();
        let config = OperatorConfig::from_lookup(|name| {
            let var = env.iter().find(|v| v["name"] == name)?;
            match var["value"].as_str() {
                Some(value) => Some(value.to_owned()),
                // Downward-API variables get a value on a cluster.
                None => var["valueFrom"]
                    .is_object()
                    .then(|| format!("from-downward-api-{name}")),
            }
        })
        .unwrap_or_else(|e| panic!("{}: the operator refuses its configuration: {e}", r.name));
        let v = &r.values;
        assert_eq!(
            config.leader_election,
            v["leaderElection"]["enabled"] == true,
            "{}",
            r.name
        );
        assert_eq!(
            config.lease,
            v["leaderElection"]["leaseName"].as_str().unwrap()
        );
        let watch: Vec<String> = serde_json::from_value(v["watchNamespaces"].clone()).unwrap();
        assert_eq!(config.namespaces, watch, "{}", r.name);
        assert_eq!(
            u64::from(config.metrics.port()),
            v["metrics"]["port"].as_u64().unwrap()
        );
        assert_eq!(
            config.settings.coordinator_image,
            container["image"].as_str().unwrap()
        );
        let tag = v["image"]["tag"]
            .as_str()
            .filter(|t| !t.is_empty())
            .unwrap_or("0.1.0");
        assert_eq!(
            container["image"],
            format!("{}:{tag}", v["image"]["repository"].as_str().unwrap()),
            "{}",
            r.name
        );
        assert_eq!(
            config.settings.network_policy.is_some(),
            v["networkPolicy"]["enabled"] == true,
            "{}",
            r.name
        );
        // The probes and the metrics Service use the port the operator serves.
        if v["metrics"]["enabled"] == true {
            assert_eq!(container["ports"][0]["containerPort"], v["metrics"]["port"]);
            assert_eq!(container["readinessProbe"]["httpGet"]["port"], "metrics");
            assert_eq!(container["livenessProbe"]["httpGet"]["port"], "metrics");
            let service = r.one("Service");
            assert_eq!(service["spec"]["ports"][0]["port"], v["metrics"]["port"]);
            assert_eq!(
                service["spec"]["selector"],
                deployment["spec"]["selector"]["matchLabels"]
            );
        } else {
            assert!(container.get("ports").is_none() && r.of_kind("Service").is_empty());
        }
        assert_eq!(
            deployment["spec"]["replicas"], v["replicaCount"],
            "{}",
            r.name
        );
        // The selector selects the pod template.
        let labels = &deployment["spec"]["template"]["metadata"]["labels"];
        for (k, val) in deployment["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap()
        {
            assert_eq!(labels[k], *val, "{}: selector {k}", r.name);
        }
        // On-demand capacity unless told otherwise; a given affinity replaces it.
        let affinity = &pod["affinity"];
        if v["affinity"].as_object().is_some_and(|a| !a.is_empty()) {
            assert_eq!(*affinity, v["affinity"], "{}", r.name);
        } else {
            assert_eq!(
                affinity["nodeAffinity"].is_object(),
                v["onDemandOnly"] == true,
                "{}",
                r.name
            );
            assert!(affinity["podAntiAffinity"].is_object(), "{}", r.name);
        }
        let sa = Expect::of(&r).service_account;
        assert_eq!(pod["serviceAccountName"], sa, "{}", r.name);
        assert_eq!(
            r.of_kind("ServiceAccount").len(),
            usize::from(v["serviceAccount"]["create"] == true),
            "{}",
            r.name
        );
        // Two replicas or more: a PDB keeps one through drains.
        let pdbs = r.of_kind("PodDisruptionBudget");
        let replicas = v["replicaCount"].as_u64().unwrap();
        assert_eq!(pdbs.len(), usize::from(replicas >= 2), "{}", r.name);
        for pdb in pdbs {
            assert_eq!(pdb["spec"]["selector"], deployment["spec"]["selector"]);
        }
    }
}

// ------------------------------------------------------------ the optional features

/// Series names in a PromQL expression (`ductile_...` outside label values).
fn series_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_string = false;
    let mut word = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c == '"' {
            in_string = !in_string;
        }
        if !in_string && (c.is_ascii_alphanumeric() || c == '_') {
            word.push(c);
        } else {
            if word.starts_with("ductile_") {
                out.insert(std::mem::take(&mut word));
            }
            word.clear();
        }
    }
    out
}

/// What the optional features render does what values.yaml says: the
/// ServiceMonitor selects the metrics Service and names its port; the
/// PodMonitor selects the operator's job pods, by the labels the operator
/// puts on them, in the watched namespaces; the PrometheusRule's alerts use
/// the thresholds of the values and only series the project exports; the
/// dashboard ConfigMap carries the chart's dashboard; the NetworkPolicy
/// switch reaches the operator and its RBAC.
#[test]
fn the_optional_features_render_what_they_promise() {
    let r = renderings()
        .into_iter()
        .find(|r| r.name == "every-feature")
        .unwrap();
    let v = &r.values;
    let ns = &r.release.namespace;

    let service = r.one("Service");
    let monitor = r.one("ServiceMonitor");
    assert_eq!(monitor["metadata"]["namespace"], *ns);
    assert_eq!(monitor["metadata"]["labels"]["release"], "kube-prometheus");
    for (k, val) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            service["metadata"]["labels"][k], *val,
            "the ServiceMonitor misses the Service"
        );
    }
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["interval"], "15s");

    // The PodMonitor selects what the operator creates.
    let pod_monitor = r.one("PodMonitor");
    assert_eq!(
        pod_monitor["spec"]["namespaceSelector"]["matchNames"],
        v["watchNamespaces"]
    );
    let example = documents(&repo_root().join("manifests/examples/jacobi2d-gpu.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "ElasticJob")
        .unwrap();
    let mut job: ductile_operator::crd::ElasticJob = serde_json::from_value(example).unwrap();
    job.metadata.namespace = Some("hpc".into());
    job.metadata.uid = Some("0000".into());
    assert!(job.spec.metrics.is_some(), "the GPU example serves metrics");
    let pod = ductile_operator::k8s::objects::launch_pod(&job, 0, &Default::default());
    let pod = serde_json::to_value(&pod).unwrap();
    for (k, val) in pod_monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            pod["metadata"]["labels"][k], *val,
            "the PodMonitor misses the job's pods"
        );
    }
    let port = &pod_monitor["spec"]["podMetricsEndpoints"][0]["port"];
    let named = pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .any(|p| p["name"] == *port);
    assert!(named, "no container port named {port} in {pod}");

    // Alerts: thresholds from the values, series that exist.
    let rule = r.one("PrometheusRule");
    let alerts = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    let names: BTreeSet<&str> = alerts.iter().filter_map(|a| a["alert"].as_str()).collect();
    for needed in [
        "DuctileRescaleFailed",
        "DuctileRescaleSlow",
        "DuctileNoticeNotActedOn",
        "DuctileJobFailed",
    ] {
        assert!(names.contains(needed), "no alert {needed}: {names:?}");
    }
    let expr = |name: &str| {
        alerts.iter().find(|a| a["alert"] == name).unwrap()["expr"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(
        expr("DuctileRescaleSlow").contains("le=\"2\""),
        "{}",
        expr("DuctileRescaleSlow")
    );
    assert!(expr("DuctileNoticeNotActedOn").contains("le=\"90\""));
    assert!(expr("DuctileOperatorDown").contains("prod-ductile-metrics"));
    for alert in alerts {
        let summary = alert["annotations"]["summary"].as_str().unwrap();
        assert!(
            !summary.contains("{{ ") || summary.contains("{{ $labels."),
            "{summary}"
        );
    }
    let operator: BTreeSet<String> = ductile_operator::k8s::metrics::Metrics::exported_series()
        .into_iter()
        .collect();
    let runtime_source = source_text(&repo_root().join("runtime/src"));
    for alert in alerts {
        for series in series_in(alert["expr"].as_str().unwrap()) {
            let known = if series.starts_with("ductile_operator_") {
                operator.contains(&series)
            } else {
                // The nodes' series: the runtime's catalogue is not reachable
                // from this crate; its source names the family.
                let family = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| series.strip_suffix(s))
                    .unwrap_or(&series);
                runtime_source.contains(&format!("\"{family}\""))
            };
            assert!(
                known,
                "alert {} queries {series}, which nothing exports",
                alert["alert"]
            );
        }
    }

    // The dashboard, as Grafana's sidecar finds it.
    let dashboard = r.one("ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("dashboards/ductile.json")).unwrap(),
    )
    .unwrap();
    let carried: Value = serde_json::from_str(dashboard["data"]["ductile.json"].as_str().unwrap())
        .expect("the ConfigMap holds JSON");
    assert_eq!(carried, shipped);

    // Every toYaml'd value reached its object.
    let deployment = r.one("Deployment");
    let pod_spec = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod_spec["imagePullSecrets"], v["imagePullSecrets"]);
    assert_eq!(pod_spec["tolerations"], v["tolerations"]);
    assert_eq!(pod_spec["nodeSelector"], v["nodeSelector"]);
    assert_eq!(pod_spec["priorityClassName"], v["priorityClassName"]);
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"],
        v["podAnnotations"]
    );
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["labels"]["team"],
        "hpc"
    );
    assert_eq!(
        r.one("ServiceAccount")["metadata"]["annotations"],
        v["serviceAccount"]["annotations"]
    );
    let log = pod_spec["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "DUCTILE_LOG")
        .unwrap();
    assert_eq!(log["value"], "debug,kube=info");
}

/// The text of every `.rs` file under `dir`.
fn source_text(dir: &Path) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.push_str(&source_text(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    out
}

/// The alerts' thresholds are `le` labels the histograms really export (a
/// threshold between two buckets matches no series and the alert never
/// fires): every value the values schema allows for
/// `noticeDeadlineSeconds` is a bucket of the operator's notice-to-commit
/// histogram as its `/metrics` prints it, and every `rescaleBudgetSeconds`
/// one of the nodes' mechanism buckets (`MECHANISM_BUCKETS` in the
/// runtime, which this crate cannot link: read from its source).
#[test]
fn the_alert_thresholds_are_buckets_the_histograms_export() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let allowed = |key: &str| -> Vec<String> {
        let rule =
            &schema["properties"]["metrics"]["properties"]["prometheusRule"]["properties"][key];
        serde_json::from_value(rule["enum"].clone()).unwrap_or_else(|e| panic!("{key}: {e}"))
    };
    let metrics = ductile_operator::k8s::metrics::Metrics::default();
    metrics.notice_to_commit(1.0);
    let page = metrics.render();
    let deadlines = allowed("noticeDeadlineSeconds");
    assert!(deadlines.contains(&"120".to_owned()), "{deadlines:?}");
    for le in deadlines {
        let series = format!("ductile_operator_notice_to_commit_seconds_bucket{{le=\"{le}\"}}");
        assert!(page.contains(&series), "no {series} in\n{page}");
    }
    let source = std::fs::read_to_string(repo_root().join("runtime/src/activity.rs")).unwrap();
    let list = source
        .split_once("pub const MECHANISM_BUCKETS")
        .and_then(|(_, rest)| rest.split_once("= ["))
        .and_then(|(_, rest)| rest.split_once("];"))
        .expect("runtime/src/activity.rs defines MECHANISM_BUCKETS")
        .0;
    let buckets: Vec<f64> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    for budget in allowed("rescaleBudgetSeconds") {
        let seconds: f64 = budget.parse().unwrap();
        assert!(
            buckets.contains(&seconds),
            "rescaleBudgetSeconds {budget} is no bucket of {buckets:?}"
        );
        // Printed the way the operator's own histogram prints its bounds.
        assert_eq!(
            format!("{seconds}"),
            budget,
            "le=\"{budget}\" would not match the exported label"
        );
    }
}
