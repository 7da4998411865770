//! `bench_soak --quick` as a test: 20 rescales of random kinds (expand,
//! shrink, replace) against one running Jacobi2D job. Behaviour only: every
//! rescale succeeds, the checksum equals a 1-node run's, the JSON holds a
//! curve for every long-lived process. Its growth verdict and timings are
//! the benchmark's business (docs/benchmarks.md, "Soak"), not this test's.

use std::process::Command;

use ductile_e2e::bin;

#[test]
fn twenty_random_rescales_all_succeed_and_keep_the_checksum() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("soak.json");
    let run = Command::new(bin("bench_soak"))
        .args(["--quick", "--seed", "7", "--out"])
        .arg(&out)
        .output()
        .expect("running bench_soak");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "bench_soak failed\n{stdout}\n{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("soak.json")).expect("JSON");
    assert_eq!(json["rescales_done"], 20, "{stdout}");
    assert_eq!(json["failed"], 0, "{stdout}");
    assert_eq!(json["checksum"]["equal"], true, "{stdout}");
    let kinds = &json["kinds"];
    let total: u64 = ["expand", "shrink", "replace"]
        .iter()
        .map(|k| kinds[k].as_u64().expect("a count"))
        .sum();
    assert_eq!(total, 20);
    // Newcomers were admitted (every expand and replace admits one).
    let admitted = json["admitted"].as_u64().expect("admitted");
    assert_eq!(
        admitted,
        kinds["expand"].as_u64().unwrap_or(0) + kinds["replace"].as_u64().unwrap_or(0)
    );
    let processes = json["processes"].as_array().expect("processes");
    for role in ["coordinator", "launcher", "node 0"] {
        let p = processes
            .iter()
            .find(|p| p["role"] == role)
            .unwrap_or_else(|| panic!("no {role} in {processes:?}"));
        assert_eq!(p["watched"], true, "{role}");
        assert_eq!(
            p["curve"].as_array().map(Vec::len),
            Some(21),
            "{role}: one sample before the rescales and one after each"
        );
    }
    // 20 rescales are too few for a verdict on growth.
    assert_eq!(json["verdict_given"], false);
}
