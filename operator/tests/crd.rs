//! The committed ElasticJob CRD: fresh (same as the Rust types generate) and
//! structural (what the API server requires of a `apiextensions.k8s.io/v1`
//! schema), checked without a cluster.

use std::path::{Path, PathBuf};

use serde_json::Value;

#[path = "support/kubernetes_validate.rs"]
mod kubernetes_validate;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("operator/ has a parent")
        .to_path_buf()
}

#[test]
fn crd_is_fresh() {
    let path = repo_root().join("crds/elasticjob.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = ductile_operator::crd::crd_yaml();
    assert!(
        committed == generated,
        "{} is stale: the ElasticJob types changed. Regenerate it with\n\n    \
         cargo run -p ductile-operator --bin crdgen > crds/elasticjob.yaml\n",
        path.display()
    );
    let chart_copy = repo_root().join("charts/ductile/crds/elasticjob.yaml");
    if chart_copy.exists() {
        assert!(
            std::fs::read_to_string(&chart_copy).unwrap() == generated,
            "{} is stale: copy crds/elasticjob.yaml there \
             (cp crds/elasticjob.yaml charts/ductile/crds/)",
            chart_copy.display()
        );
    }
}

/// Checks the structural-schema rules of
/// <https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema>
/// that a generator can get wrong, collecting every violation with its path.
fn structural_violations(node: &Value, path: &str, out: &mut Vec<String>) {
    let Some(object) = node.as_object() else {
        out.push(format!("{path}: schema is not an object"));
        return;
    };
    for forbidden in ["$ref", "definitions", "$defs", "oneOf", "not"] {
        if object.contains_key(forbidden) {
            out.push(format!("{path}: `{forbidden}` is not allowed"));
        }
    }
    let int_or_string = object.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let preserve = object.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if !object.contains_key("type") && !int_or_string && !preserve {
        out.push(format!("{path}: no `type`"));
    }
    if object.contains_key("properties") && object.contains_key("additionalProperties") {
        out.push(format!("{path}: both properties and additionalProperties"));
    }
    if object.get("type").and_then(Value::as_str) == Some("array") && !object.contains_key("items")
    {
        out.push(format!("{path}: array without items"));
    }
    for junction in ["anyOf", "allOf"] {
        // Inside anyOf/allOf only value validations may appear (no types,
        // descriptions, defaults or nullable), and int-or-string is the only
        // anyOf a structural schema may carry at the node itself.
        if let Some(list) = object.get(junction).and_then(Value::as_array) {
            for (i, branch) in list.iter().enumerate() {
                for key in [
                    "type",
                    "description",
                    "default",
                    "nullable",
                    "additionalProperties",
                ] {
                    if branch.get(key).is_some() {
                        out.push(format!("{path}.{junction}[{i}]: `{key}` is not allowed"));
                    }
                }
            }
        }
    }
    if let Some(props) = object.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            structural_violations(child, &format!("{path}.{name}"), out);
        }
    }
    if let Some(items) = object.get("items") {
        structural_violations(items, &format!("{path}[]"), out);
    }
    if let Some(extra) = object.get("additionalProperties") {
        if extra.is_object() {
            structural_violations(extra, &format!("{path}{{}}"), out);
        }
    }
}

fn committed_crd() -> Value {
    let text = std::fs::read_to_string(repo_root().join("crds/elasticjob.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

#[test]
fn crd_schema_is_structural() {
    let crd = committed_crd();
    let versions = crd["spec"]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 1);
    let schema = &versions[0]["schema"]["openAPIV3Schema"];
    let mut violations = Vec::new();
    structural_violations(schema, "", &mut violations);
    assert!(
        violations.is_empty(),
        "not structural:\n{}",
        violations.join("\n")
    );
    // The root may describe only apiVersion, kind, metadata, spec, status.
    for key in schema["properties"].as_object().unwrap().keys() {
        assert!(
            ["apiVersion", "kind", "metadata", "spec", "status"].contains(&key.as_str()),
            "unexpected root property {key}"
        );
    }
}

#[test]
fn crd_is_small_enough_for_tooling() {
    // etcd's object limit is 1.5 MiB and client-side `kubectl apply` keeps a
    // 256 KiB annotation; stay under the latter so both ways of applying work.
    let json = serde_json::to_string(&committed_crd()).unwrap();
    assert!(json.len() < 256 * 1024, "CRD JSON is {} bytes", json.len());
}

#[test]
fn crd_carries_the_cel_rules_and_scale_selector() {
    let crd = committed_crd();
    let version = &crd["spec"]["versions"][0];
    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let rules: Vec<&str> = spec["x-kubernetes-validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule"].as_str().unwrap())
        .collect();
    assert!(
        rules.contains(&"self.minReplicas <= self.replicas"),
        "{rules:?}"
    );
    assert!(rules
        .iter()
        .any(|r| r.contains("self.replicas <= self.maxReplicas")));
    assert_eq!(
        spec["properties"]["pesPerPod"]["minimum"].as_f64(),
        Some(1.0)
    );
    assert_eq!(
        spec["properties"]["replicas"]["minimum"].as_f64(),
        Some(1.0)
    );
    assert_eq!(
        version["subresources"]["scale"]["labelSelectorPath"],
        ".status.selector"
    );
    assert!(version["subresources"]["status"].is_object());
}

/// `kubernetes-validate` (PyPI) checks the CRD and the install bundle against
/// the Kubernetes API schemas of the oldest and newest versions the chart
/// supports, strict, offline; it never skips (`support/kubernetes_validate.rs`).
#[test]
fn kubernetes_validate_accepts_the_crd_and_install_bundle() {
    let root = repo_root();
    let files = [
        Path::new("crds/elasticjob.yaml"),
        Path::new("manifests/install.yaml"),
    ];
    for version in kubernetes_validate::VERSIONS {
        if let Err(report) = kubernetes_validate::validate(&root, version, &files) {
            panic!("{report}");
        }
    }
}
