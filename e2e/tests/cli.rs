//! The local CLI seen from outside, with real processes: what is left when a
//! launcher is killed (nothing, wrapper scripts included), a coordinator
//! whose job is gone, and one restarted under a job that rejoins it.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ductile_coordinator::proto::{Registration, Role};
use ductile_coordinator::{Admission, Client, Secret};
use ductile_e2e::{alive, bin, eventually};

const WAIT: Duration = Duration::from_secs(60);

/// A child process killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every live process whose environment holds `marker` (`KEY=VALUE`): what
/// a `ductile run` given that variable started, however deep.
fn marked(marker: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || !alive(pid) {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|&b| b == 0).any(|kv| kv == marker.as_bytes()) {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmdline));
        }
    }
    found
}

/// A shell script that runs its arguments without `exec` (as HPC wrappers
/// that load modules or set the environment do), then reports.
fn wrapper(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("wrap.sh");
    std::fs::write(
        &path,
        "#!/bin/sh\n# no exec: the program is a grandchild of the launcher\n\"$@\"\ncode=$?\necho \"wrapper: the program exited with $code\" >&2\nexit $code\n",
    )
    .expect("writing the wrapper");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

#[test]
fn a_launcher_killed_with_sigkill_leaves_no_process_behind_even_through_a_wrapper() {
    let work = tempfile::tempdir().expect("temp dir");
    let state = work.path().join("s");
    let marker_value = format!("{}-{}", std::process::id(), work.path().display());
    let marker = format!("DUCTILE_TEST_MARK={marker_value}");
    let launcher = Command::new(bin("ductile"))
        .args(["run", "--nodes", "3", "--timeout", "300", "--state-dir"])
        .arg(&state)
        .arg("--")
        .arg(wrapper(work.path()))
        .arg(bin("jacobi2d"))
        .args(["--grid", "512", "--block", "64", "--iters", "10000000"])
        .env("DUCTILE_TEST_MARK", &marker_value)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning ductile run");
    let mut launcher = Killed(launcher);
    // The job runs: node 0 (behind its wrapper) serves the control endpoint.
    assert!(
        eventually(WAIT, || state.join("control.addr").exists()),
        "the job never started"
    );
    let before = marked(&marker);
    let programs = before
        .iter()
        .filter(|(_, cmd)| cmd.contains("jacobi2d") && !cmd.contains("wrap.sh"))
        .count();
    assert_eq!(programs, 3, "three nodes behind three wrappers: {before:?}");
    assert!(
        before.iter().any(|(_, cmd)| cmd.contains(" coordinator ")),
        "{before:?}"
    );

    launcher.0.kill().expect("SIGKILL to the launcher");
    let _ = launcher.0.wait();
    let t0 = Instant::now();
    let gone = eventually(Duration::from_secs(10), || marked(&marker).is_empty());
    let left = marked(&marker);
    for (pid, _) in &left {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        gone,
        "left running {:.1}s after the launcher was killed: {left:?}",
        t0.elapsed().as_secs_f64()
    );
}

/// Starts `ductile coordinator` with `args`; returns it and its address.
fn coordinator(secret: &Secret, args: &[&str]) -> (Killed, String) {
    let mut child = Command::new(bin("ductile"))
        .arg("coordinator")
        .args(args)
        .args(["--secret-env", "DUCTILE_SECRET"])
        .env("DUCTILE_SECRET", secret.to_hex())
        .env_remove("DUCTILE_LAUNCHER_FD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the coordinator");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the coordinator's address line");
    (Killed(child), line.trim().to_owned())
}

fn member(index: u32) -> Registration {
    Registration {
        role: Role::Launch { index },
        address: b"127.0.0.1:1".to_vec(),
        pes: 1,
        host: "test".into(),
        pid: std::process::id(),
        fingerprint: 7,
    }
}

fn stderr_of(mut child: Killed) -> (Option<i32>, String) {
    use std::io::Read;
    let status = child.0.wait().expect("wait");
    let mut text = String::new();
    if let Some(mut err) = child.0.stderr.take() {
        let _ = err.read_to_string(&mut text);
    }
    (status.code(), text)
}

/// Waits up to `limit` for the child to exit; whether it did.
fn exits_within(child: &mut Killed, limit: Duration) -> bool {
    eventually(limit, || child.0.try_wait().ok().flatten().is_some())
}

#[test]
fn a_coordinator_whose_members_are_all_gone_after_the_start_exits() {
    let secret = Secret::generate();
    let (mut coord, addr) = coordinator(
        &secret,
        &[
            "--listen",
            "127.0.0.1:0",
            "--expect",
            "2",
            "--idle-timeout",
            "1",
        ],
    );
    let clients: Vec<Client> = (0..2)
        .map(|_| Client::connect(&addr, &secret, WAIT).expect("connect"))
        .collect();
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            std::thread::spawn(move || {
                let admitted = c.register(member(i as u32), WAIT).expect("register");
                assert!(matches!(admitted, Admission::Member { .. }));
                c
            })
        })
        .collect();
    let clients: Vec<Client> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // The job runs; the members stay connected: nothing happens.
    assert!(!exits_within(&mut coord, Duration::from_secs(2)));
    // Both gone, as when their processes are killed.
    for c in clients {
        c.close();
    }
    assert!(
        exits_within(&mut coord, Duration::from_secs(15)),
        "the coordinator outlived its job"
    );
    let (code, stderr) = stderr_of(coord);
    assert_eq!(code, Some(5), "{stderr}");
    assert!(
        stderr.contains("no member of the job has been connected"),
        "{stderr}"
    );
}

#[test]
fn a_restarted_coordinator_that_members_rejoin_keeps_serving_past_the_idle_timeout() {
    let secret = Secret::generate();
    let (coord, addr) = coordinator(
        &secret,
        &[
            "--listen",
            "127.0.0.1:0",
            "--expect",
            "1",
            "--idle-timeout",
            "1",
        ],
    );
    let node0 = Client::connect(&addr, &secret, WAIT).expect("connect");
    let Admission::Member { view, .. } = node0.register(member(0), WAIT).expect("register") else {
        panic!("not admitted")
    };
    // The coordinator is lost (SIGKILL); a new one starts on the same address
    // and node 0 hands it the view, as after `ductile run` restarts one.
    drop(coord);
    let _ = node0.recv_timeout(Duration::from_millis(500));
    node0.close();
    let (mut coord, again) = coordinator(
        &secret,
        &["--listen", &addr, "--recover", "--idle-timeout", "1"],
    );
    assert_eq!(again, addr);
    let node0 = Client::connect(&addr, &secret, WAIT).expect("reconnect");
    let restored = node0.restore(view.clone(), 7, WAIT).expect("restore");
    assert_eq!(restored, view);
    // Three idle timeouts later it still serves its rejoined member.
    assert!(!exits_within(&mut coord, Duration::from_secs(3)));
    assert!(alive(coord.0.id()));
    let code = node0
        .shutdown_barrier(view.epoch, 0, WAIT)
        .expect("the barrier");
    assert_eq!(code, 0);
    assert!(exits_within(&mut coord, Duration::from_secs(15)));
    let (code, stderr) = stderr_of(coord);
    assert_eq!(code, Some(0), "{stderr}");
}

/// Runs `ductile ARGS` to its end; (exit code, stdout, stderr).
fn ductile(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin("ductile"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running ductile");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn jacobi2d_answers_help_and_refuses_unknown_flags() {
    let run = |args: &[&str]| {
        Command::new(bin("jacobi2d"))
            .args(args)
            .env_remove("DUCTILE_COORDINATOR")
            .stdin(Stdio::null())
            .output()
            .expect("jacobi2d")
    };
    let help = run(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("--grid") && text.contains("[default: 256]"),
        "{text}"
    );
    for bad in [&["--bogus"][..], &["--size", "4096"], &["--grid", "abc"]] {
        let out = run(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
    let out = run(&["--iter", "5"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--iters"),
        "a suggestion"
    );
    // The runtime's own +flags are not the program's.
    let out = run(&[
        "--grid", "16", "--block", "8", "--iters", "2", "--quiet", "+lb", "Greedy",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_program_refusing_its_arguments_makes_ductile_run_exit_2_saying_why() {
    let state = tempfile::tempdir().expect("temp dir");
    let (code, _, stderr) = ductile(&[
        "run",
        "--nodes",
        "2",
        "--timeout",
        "60",
        "--state-dir",
        &state.path().to_string_lossy(),
        "--",
        &bin("jacobi2d").to_string_lossy(),
        "--grid",
        "abc",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("`abc` is not N or AxB"), "{stderr}");
    assert!(stderr.contains("refused its arguments"), "{stderr}");
    assert!(!stderr.contains("with code 0 but"), "{stderr}");
}

#[test]
fn status_waits_for_a_starting_job_prints_addresses_as_text_and_reports_an_ended_one() {
    let work = tempfile::tempdir().expect("temp dir");
    let state = work.path().join("s");
    let state_arg = state.to_string_lossy().into_owned();
    let launcher = Command::new(bin("ductile"))
        .args([
            "run",
            "--nodes",
            "2",
            "--timeout",
            "120",
            "--state-dir",
            &state_arg,
            "--",
        ])
        // Each node starts 3 s late, so the job is still starting when the
        // test looks (it once came too late on a loaded machine, where the
        // launcher and node 0 were quicker than the test's poll).
        .args(["sh", "-c", "sleep 3; exec \"$0\" \"$@\""])
        .arg(bin("jacobi2d"))
        .args([
            "--grid",
            "256",
            "--block",
            "32",
            "--iters",
            "100000000",
            "--quiet",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning ductile run");
    // Reaped as soon as it ends (as a shell would), so `ductile stop` sees it gone.
    let launcher_pid = launcher.id();
    let mut launcher = launcher;
    let reaper = std::thread::spawn(move || launcher.wait());
    // As soon as the launcher holds its state directory (launcher.pid),
    // long before node 0 serves: the command waits for the job. (Before the
    // launcher has written its pid file there is no job to wait for.)
    assert!(eventually(WAIT, || state.join("launcher.pid").exists()));
    assert!(
        !state.join("control.addr").exists(),
        "the test came too late"
    );
    let (code, stdout, stderr) = ductile(&[
        "status",
        "--json",
        "--timeout",
        "60",
        "--state-dir",
        &state_arg,
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    // A TCP address as `ip:port`; a UCX worker address (binary) as hex.
    let address = status["members"][0]["address"].as_str().unwrap_or_default();
    let ucx = std::env::var("DUCTILE_TRANSPORT").is_ok_and(|t| t == "ucx");
    let as_text = if ucx {
        !address.is_empty() && address.chars().all(|c| c.is_ascii_hexdigit())
    } else {
        address.starts_with("127.0.0.1:")
    };
    assert!(as_text, "{status}");
    assert_eq!(status["running"], true);
    let (code, stdout, _) = ductile(&["list", "--root", &work.path().to_string_lossy()]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("running"), "{stdout}");
    // Stopped: `status` then says how it ended.
    let (code, _, stderr) = ductile(&["stop", "--state-dir", &state_arg]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("stopped: interrupted"), "{stderr}");
    let (code, stdout, stderr) = ductile(&["status", "--state-dir", &state_arg]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("is not running; it ended: interrupted"),
        "{stdout}"
    );
    let (code, _, _) = ductile(&["stop", "--state-dir", &state_arg]);
    assert_eq!(code, Some(2), "no running job");
    assert!(reaper.join().is_ok() && !alive(launcher_pid));
    let (code, _, _) = ductile(&[
        "status",
        "--state-dir",
        &work.path().join("none").to_string_lossy(),
    ]);
    assert_eq!(code, Some(2), "no job ever");
}

#[test]
fn a_node_killed_mid_job_is_reported_once_by_name_with_the_verdict_last() {
    let state = tempfile::tempdir().expect("temp dir");
    let state_arg = state.path().to_string_lossy().into_owned();
    // Two PEs per node: every PE of every survivor is a candidate for a
    // "send failed" line and a state dump; none may reach the terminal.
    let launcher = Command::new(bin("ductile"))
        .args([
            "run",
            "--nodes",
            "3",
            "--pes-per-node",
            "2",
            "--timeout",
            "120",
            "--state-dir",
            &state_arg,
            "--",
        ])
        .arg(bin("jacobi2d"))
        .args(["--grid", "512", "--block", "32", "--iters", "100000000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning ductile run");
    let mut launcher = Killed(launcher);
    let stderr = launcher.0.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    // The job computes: its status answers with three members (asked once
    // the launcher holds the state directory: before, there is no job).
    assert!(eventually(WAIT, || state.path().join("launcher.pid").exists()));
    let (code, stdout, stderr_text) = ductile(&[
        "status",
        "--json",
        "--timeout",
        "60",
        "--state-dir",
        &state_arg,
    ]);
    assert_eq!(code, Some(0), "{stderr_text}");
    let status: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(status["members"].as_array().map(Vec::len), Some(3), "{status}");
    std::thread::sleep(Duration::from_millis(500));
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(state.path().join("job.json")).expect("job.json"),
    )
    .expect("job.json is JSON");
    let victim = record["nodes"][2]["pid"].as_u64().expect("node 2's pid");
    let st = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    assert!(
        exits_within(&mut launcher, Duration::from_secs(30)),
        "the job did not end after node 2 was killed"
    );
    let code = launcher.0.wait().expect("launcher").code();
    let lines = reader.join().expect("stderr reader");
    let text = lines.join("\n");
    assert_eq!(code, Some(1), "{text}");
    let verdict = lines.last().expect("a verdict");
    assert!(
        verdict.starts_with(&format!(
            "ductile: node 2 (pid {victim}) was killed by signal 9 (SIGKILL)"
        )),
        "the verdict is the last line and names the node: {text}"
    );
    // Said once: before the verdict at most one line, a node's, naming
    // node 2; no per-PE send failures or state dumps.
    let before = &lines[..lines.len() - 1];
    assert!(before.len() <= 1, "a short report, not a cascade: {text}");
    assert!(before.iter().all(|l| l.contains("node 2 ")), "{text}");
    assert!(!text.contains("send failed"), "{text}");
    assert!(!text.contains("PE state"), "{text}");
}

#[test]
fn every_program_answers_help_and_refuses_unknown_flags_with_a_suggestion() {
    let run = |program: &str, args: &[&str]| {
        let out = Command::new(bin(program))
            .args(args)
            .env_remove("DUCTILE_COORDINATOR")
            .stdin(Stdio::null())
            .output()
            .expect("running the program");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // (program, a flag it has, that flag misspelt)
    let programs = [
        ("counter", None),
        ("lbbench", Some(("--iters", "--iter"))),
        ("elastic_probe", Some(("--rounds", "--round"))),
        ("pingpong", Some(("--sizes", "--size"))),
        ("megatest", Some(("--seed", "--sed"))),
        ("gpu_probe", Some(("--bytes", "--byte"))),
        ("bench_core", Some(("--reps", "--rep"))),
        ("bench_rescale", Some(("--nodes", "--node"))),
        ("bench_lb", Some(("--reps", "--rep"))),
        ("bench_handoff", Some(("--trips", "--trip"))),
        ("collectives", Some(("--carry", "--cary"))),
    ];
    for (program, flag) in programs {
        let (code, stdout, stderr) = run(program, &["--help"]);
        assert_eq!(code, Some(0), "{program} --help: {stderr}");
        assert!(stdout.contains("Usage:"), "{program} --help: {stdout}");
        let (code, _, stderr) = run(program, &["--bogus"]);
        assert_eq!(code, Some(2), "{program} --bogus");
        assert!(stderr.contains("'--bogus'"), "{program}: {stderr}");
        if let Some((flag, typo)) = flag {
            assert!(stdout.contains(flag), "{program} --help lists {flag}");
            let (code, _, stderr) = run(program, &[typo, "1"]);
            assert_eq!(code, Some(2), "{program} {typo}");
            assert!(stderr.contains(flag), "{program} {typo}: no suggestion: {stderr}");
        }
    }
    // Defaults are shown; values and cross-flag rules are checked before anything runs.
    let (_, stdout, _) = run("lbbench", &["--help"]);
    assert!(stdout.contains("[default: 100]"), "{stdout}");
    for (program, args) in [
        ("megatest", &[][..]),
        ("megatest", &["nosuchmodule"]),
        ("lbbench", &["--load", "lumpy"]),
        ("pingpong", &["--sizes", "8,x"]),
        ("bench_core", &["--grid", "8"]),
        ("bench_rescale", &["--nodes", "4", "--step", "4"]),
        ("gpu_probe", &["--cc", "9.0"]),
    ] {
        let (code, _, stderr) = run(program, args);
        assert_eq!(code, Some(2), "{program} {args:?}: {stderr}");
    }
}

/// `--node-pes`: nodes of different PE counts in one job (as instance
/// types of different shapes); the result equals a one-node run's, and
/// `job.json` records each node's PEs. A count list that does not match
/// `--nodes` is refused before anything starts.
#[test]
fn nodes_of_different_pe_counts_run_one_job_with_the_one_node_result() {
    let jacobi = bin("jacobi2d").to_string_lossy().into_owned();
    let program = [
        jacobi.as_str(), "--grid", "256", "--block", "32", "--iters", "200", "--lb-every", "20",
    ];
    let checksum = |stdout: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("checksum="))
            .map(|c| c.split_whitespace().next().unwrap_or_default().to_owned())
    };
    let state = tempfile::tempdir().expect("temp dir");
    let dir = state.path().to_string_lossy().into_owned();
    let mut args = vec!["run", "-n", "3", "--node-pes", "1,2,1", "--timeout", "60", "--state-dir", &dir, "--"];
    args.extend(program);
    let (code, stdout, stderr) = ductile(&args);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("pes=4 nodes=3"), "{stdout}");
    let job: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.path().join("job.json")).expect("job.json")).expect("JSON");
    let pes: Vec<u64> = job["nodes"].as_array().expect("nodes").iter().map(|n| n["pes"].as_u64().unwrap()).collect();
    assert_eq!(pes, [1, 2, 1], "{job}");
    let one = tempfile::tempdir().expect("temp dir");
    let one_dir = one.path().to_string_lossy().into_owned();
    let mut args = vec!["run", "-n", "1", "--timeout", "60", "--state-dir", &one_dir, "--"];
    args.extend(program);
    let (code, reference, stderr) = ductile(&args);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(checksum(&stdout).is_some(), "{stdout}");
    assert_eq!(checksum(&stdout), checksum(&reference), "{stdout}\n{reference}");

    let bad = tempfile::tempdir().expect("temp dir");
    let bad_dir = bad.path().to_string_lossy().into_owned();
    let mut args = vec!["run", "-n", "3", "--node-pes", "1,2", "--state-dir", &bad_dir, "--"];
    args.extend(program);
    let (code, _, stderr) = ductile(&args);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--node-pes names 2 PE counts for 3 nodes"), "{stderr}");
    assert!(!bad.path().join("job.json").exists(), "nothing was started: {stderr}");

    let mut args = vec!["run", "-n", "3", "--node-cgroups", "/nonexistent/a,/nonexistent/b", "--state-dir", &bad_dir, "--"];
    args.extend(program);
    let (code, _, stderr) = ductile(&args);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--node-cgroups names 2 cgroups for 3 nodes"), "{stderr}");
    assert!(!bad.path().join("job.json").exists(), "nothing was started: {stderr}");
}

/// With a CPU per PE, `+pe-affinity=auto` (the default) pins each PE of a
/// node to a CPU of its own, and nodes that share the machine (numbered by
/// the launcher) each from another CPU on: two nodes' PE 0 pinned to the
/// same CPU took turns on it while the other CPUs idled.
#[test]
fn nodes_sharing_the_machine_pin_their_pes_from_different_cpus() {
    let nproc = Command::new("nproc").output().expect("running nproc");
    let cpus = String::from_utf8_lossy(&nproc.stdout).trim().to_owned();
    let jacobi = bin("jacobi2d").to_string_lossy().into_owned();
    let run = |nodes: &str| {
        let state = tempfile::tempdir().expect("temp dir");
        let dir = state.path().to_string_lossy().into_owned();
        let out = Command::new(bin("ductile"))
            .args(["run", "-n", nodes, "--pes-per-node", &cpus, "--timeout", "60", "--state-dir", &dir])
            .args(["--", &jacobi, "--grid", "64", "--block", "32", "--iters", "4"])
            .env("DUCTILE_LOG", "warn,ductile::affinity=debug")
            .stdin(Stdio::null())
            .output()
            .expect("running ductile");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // The CPU each node's PE 0 is pinned to.
    let first_cpus = |stderr: &str| -> Vec<String> {
        stderr
            .lines()
            .filter(|l| l.contains("PE thread pinned to CPU") && l.contains("rank=0"))
            .filter_map(|l| l.rsplit("CPU ").next().map(|c| c.trim().to_owned()))
            .collect()
    };
    let alone = run("1");
    let pinned = alone.matches("PE thread pinned to CPU").count();
    assert_eq!(pinned.to_string(), cpus, "a lone node with a CPU per PE pins each PE\n{alone}");
    assert_eq!(first_cpus(&alone).len(), 1, "{alone}");
    let shared = run("2");
    let pinned = shared.matches("PE thread pinned to CPU").count();
    assert_eq!(pinned.to_string(), (2 * cpus.parse::<usize>().unwrap()).to_string(), "{shared}");
    let firsts = first_cpus(&shared);
    assert_eq!(firsts.len(), 2, "{shared}");
    if cpus != "1" {
        assert_ne!(firsts[0], firsts[1], "both nodes pinned PE 0 to one CPU\n{shared}");
    }
}

/// A relaunch from a checkpoint starts every node with `--pes-per-node`
/// PEs: on a job of nodes of different PE counts, `ductile rescale --mode
/// restart` is refused by the launcher before any checkpoint, exits 2, and
/// the job goes on untouched.
#[test]
fn a_restart_rescale_of_a_job_of_mixed_shapes_is_refused_and_the_job_goes_on() {
    use ductile_e2e::background::Background;
    let mut job = Background::launch(
        2,
        "jacobi2d",
        &["--grid", "512", "--block", "64", "--iters", "200000", "--lb-every", "20", "--residual-every", "100000"],
    )
    .flags(&["--node-pes", "1,2"])
    .timeout_s(120)
    .start();
    let out = Command::new(bin("ductile"))
        .args(["rescale", "--mode", "restart", "--add", "1", "--timeout", "30", "--state-dir"])
        .arg(job.state())
        .stdin(Stdio::null())
        .output()
        .expect("running ductile rescale");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot keep nodes of different PE counts: this job runs nodes of 1, 2 PEs"), "{stderr}");
    assert!(!job.path("ckpt").exists(), "no checkpoint was asked for");
    let status = job.try_status().expect("the job still answers");
    assert_eq!(status.epoch, 1, "nothing changed");
    assert_eq!(status.members.iter().map(|m| m.pes).collect::<Vec<_>>(), [1, 2]);
    assert!(job.running(), "the job goes on");
}

/// `GET /metrics` on `addr`: the page's body.
fn metrics_page(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s =
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).expect("request");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("reply");
    reply
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned())
}

/// The value of the sample `name` (no labels) on a metrics page.
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Issue 20: a Jacobi2D job running with the runtime's in-memory
/// checkpoints (`+ft-every 5`: every 5th load-balancing sync point, one
/// every 10 iterations) survives node 2 of 4 killed with SIGKILL, no
/// notice: the survivors keep their processes, node 0 commits a view
/// without the lost node (a higher epoch), every survivor rolls back to the
/// last complete checkpoint, and the job ends normally (exit 0) with the
/// checksum of an uninterrupted run. The launcher says once that the job
/// recovered, and node 0's metrics count the recovery.
#[test]
fn a_node_killed_without_notice_under_ft_every_is_recovered_from_with_the_same_checksum() {
    use ductile_e2e::background::Background;
    let mut plain = ductile_e2e::jacobi_args(40_000);
    plain.extend(["--lb-every".to_owned(), "10".to_owned()]);
    // Fault tolerance changes when work is done, never its result.
    let want = ductile_e2e::reference_checksum(&plain);
    let mut spec = plain.clone();
    spec.extend(["+ft-every".to_owned(), "5".to_owned()]);
    let job = Background::launch(4, "jacobi2d", &spec)
        .flags(&["--metrics-port", "0"])
        .timeout_s(240)
        .start();
    let before = job.control().status().expect("status");
    assert_eq!(before.members.len(), 4);
    let pids: Vec<u32> = before.members.iter().map(|m| m.pid).collect();
    // Past a few checkpoints (one every 50 iterations).
    std::thread::sleep(Duration::from_secs(2));
    let victim = pids[2];
    assert!(alive(victim));
    ductile_e2e::signal(victim, "-9");

    // A view without it, with every survivor's process unchanged.
    let mut after = None;
    assert!(
        eventually(WAIT, || {
            let status = job.try_status();
            let done = status
                .as_ref()
                .is_some_and(|s| !s.members.iter().any(|m| m.pid == victim));
            if done {
                after = status;
            }
            done
        }),
        "no view without the killed node\n{}",
        job.stderr()
    );
    let after = after.expect("a view");
    assert!(
        after.epoch > before.epoch,
        "{} -> {}",
        before.epoch,
        after.epoch
    );
    let survivors: Vec<u32> = after.members.iter().map(|m| m.pid).collect();
    assert_eq!(
        survivors,
        [pids[0], pids[1], pids[3]],
        "survivors keep their processes"
    );
    assert!(survivors.iter().all(|&p| alive(p)));
    let addr = std::fs::read_to_string(job.path("metrics.addr")).expect("metrics.addr");
    // The view commits before the rollback's restore and first step end,
    // which is when the recovery is counted.
    let mut page = String::new();
    let counted = eventually(WAIT, || {
        page = metrics_page(addr.trim());
        sample(&page, "ductile_recoveries_total").is_some()
    });
    assert!(counted, "no recovery counted\n{page}");
    assert_eq!(
        sample(&page, "ductile_recoveries_total"),
        Some(1.0),
        "{page}"
    );
    assert!(
        sample(&page, "ductile_last_recovery_seconds").is_some_and(|s| s > 0.0),
        "{page}"
    );

    let end = job.finish();
    end.completes_with(&want);
    let said =
        format!("(pid {victim}) was killed by signal 9 (SIGKILL); the job recovered without it");
    assert_eq!(
        end.stderr.matches(&said).count(),
        1,
        "said once\n{}",
        end.stderr
    );
    assert!(
        end.stderr.contains(&format!("node 2 {said}")),
        "{}",
        end.stderr
    );
}
