#!/usr/bin/env python3
"""Turns what e2e/gpu/run.sh collected in WORK into OUT/summary.md and
OUT/results.json. Usage: summarize.py WORK OUT. Exits 1 when a check failed."""

import glob
import json
import os
import re
import statistics
import sys

work, out = sys.argv[1], sys.argv[2]
results = {"checks": {}}
failed = []
md = ["# Ductile GPU checks (e2e/gpu/run.sh)", ""]


def check(name, ok, detail=""):
    results["checks"][name] = {"ok": bool(ok), "detail": detail}
    if not ok:
        failed.append(f"{name}: {detail}")


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def dig(d, *keys):
    """d[k1][k2]..., or None where a level is missing or null."""
    for k in keys:
        if not isinstance(d, dict) or d.get(k) is None:
            return None
        d = d[k]
    return d


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


# ------------------------------------------------------------ bandwidth
bw = {}
try:
    bw = json.loads(read(f"{work}/bandwidth.json").strip().splitlines()[-1])
except (ValueError, IndexError):
    pass
results["bandwidth"] = bw
kernels = read(f"{work}/kernels.txt").strip()
results["kernels"] = kernels
md += [f"Kernels: {kernels or 'unknown'}", ""]
check("bandwidth measured", bool(bw), "gpu_probe printed nothing")
if bw:
    md += [
        f"Device: **{bw['device']}** (compute capability {bw['compute_capability'][0]}.{bw['compute_capability'][1]})",
        "",
        "| copy (pinned host, 1 GiB, median of 10) | GB/s |",
        "|---|---:|",
        f"| host to device | {bw['h2d_gbs']:.1f} |",
        f"| device to host | {bw['d2h_gbs']:.1f} |",
        f"| device to device (read + write) | {bw['d2d_gbs']:.1f} |",
        "",
        f"First context of a process (driver load + cuInit + primary context): {bw['context_ms']:.1f} ms",
        "",
    ]

# ------------------------------------------------------------ checksums
md += ["## Jacobi2D: GPU checksum vs CPU checksum", "", "| run | CPU | GPU | residual lines equal | agree |", "|---|---|---|---|---|"]
rows = []
for line in read(f"{work}/checksums.txt").splitlines():
    name, cpu, gpu, res = (line.split() + ["", "", "", ""])[:4]
    ok = cpu != "" and cpu == gpu and res == "yes"
    rows.append({"run": name, "cpu": cpu, "gpu": gpu, "residuals_equal": res == "yes", "agree": ok})
    md.append(f"| {name} | `{cpu}` | `{gpu}` | {res} | {'yes' if ok else '**NO**'} |")
results["checksums"] = rows
check("gpu checksums equal cpu checksums", rows and all(r["agree"] for r in rows), json.dumps(rows))
md.append("")

# ------------------------------------------------------------ GPU log lines
READY = re.compile(r"gpu ready .*?pid=(\d+).*?context_ms=([\d.]+).*?compile_ms=([\d.]+).*?load_ms=([\d.]+).*?total_ms=([\d.]+)")
PE_READY = re.compile(r"gpu pe ready .*?pid=(\d+) rank=(\d+).*? context=(0x[0-9a-f]+)")
PE_EXIT = re.compile(
    r"gpu pe at exit .*?pid=(\d+) rank=(\d+).*? context=(0x[0-9a-f]+) context_at_start=(0x[0-9a-f]+) "
    r"same_context=(\w+) contexts_created=(\d+) canary_intact=(\w+)"
)


def gpu_logs(name):
    procs = {}
    for path in glob.glob(f"{work}/logs-{name}/*"):
        for line in read(path).splitlines():
            m = READY.search(line)
            if m:
                p = procs.setdefault(int(m[1]), {"ready": [], "pe": {}, "exit": {}})
                p["ready"].append({"context_ms": float(m[2]), "compile_ms": float(m[3]), "load_ms": float(m[4]), "total_ms": float(m[5])})
            m = PE_READY.search(line)
            if m:
                procs.setdefault(int(m[1]), {"ready": [], "pe": {}, "exit": {}})["pe"][int(m[2])] = m[3]
            m = PE_EXIT.search(line)
            if m:
                procs.setdefault(int(m[1]), {"ready": [], "pe": {}, "exit": {}})["exit"][int(m[2])] = {
                    "context": m[3], "context_at_start": m[4], "same_context": m[5] == "true",
                    "contexts_created": int(m[6]), "canary_intact": m[7] == "true",
                }
    return procs


def bench(name):
    try:
        return json.loads(read(f"{work}/rescale-{name}.json"))
    except ValueError:
        return None


# ------------------------------------------------------------ survivors
md += ["## 20 rescales of a GPU job: survivors keep their contexts", ""]
sv = bench("survive")
procs = gpu_logs("survive")
if sv and sv.get("runs"):
    run = sv["runs"][0]
    job = run["job"]
    reps = sv["parameters"]["reps"]
    rescales = sum(len(op["rescales"]) for op in run["ops"])
    kept = sv["parameters"]["nodes"][0] - sv["parameters"]["step"]
    survivors = job["launch_pids"][:kept]
    md.append(
        f"{rescales} rescales ({reps} shrink + expand pairs of a {run['nodes']}-node `jacobi2d {' '.join(job['args'])}`); "
        f"checksum `{job['checksum']}`, 1-node run `{job['reference_1_node_checksum']}`: "
        f"{'agree' if job['checksums_agree'] else '**DIFFER**'}."
    )
    md += ["", "| process | role | contexts created | context at start | context at exit | same | device memory (canary) intact |", "|---|---|---:|---|---|---|---|"]
    survivor_ok = True
    for pid in sorted(procs, key=lambda p: (p not in survivors, p)):
        p = procs[pid]
        role = "survivor (never left)" if pid in survivors else ("launch node" if pid in job["launch_pids"] else "newcomer / left")
        for rank, e in sorted(p["exit"].items()):
            same = e["same_context"] and e["context"] == e["context_at_start"] == p["pe"].get(rank)
            ok = same and e["canary_intact"] and e["contexts_created"] == 1 and len(p["ready"]) == 1
            if pid in survivors:
                survivor_ok &= ok
            md.append(
                f"| {pid} (PE {rank}) | {role} | {e['contexts_created']} | `{p['pe'].get(rank, '?')}` | `{e['context']}` | "
                f"{'yes' if same else '**NO**'} | {'yes' if e['canary_intact'] else '**NO**'} |"
            )
    missing = [pid for pid in survivors if not procs.get(pid, {}).get("exit")]
    check("20 rescales: checksum agrees", job["checksums_agree"] and rescales >= 2 * reps, f"{job['checksum']} vs {job['reference_1_node_checksum']}")
    check("survivors keep their context and device memory", survivor_ok and not missing and len(survivors) == kept,
          f"survivors {survivors}, without exit lines {missing}")
    results["survive"] = {"rescales": rescales, "job": job, "processes": procs}
else:
    check("20 rescales ran", False, "no rescale-survive.json")
md.append("")

# ------------------------------------------------------------ rescale timings
md += [
    "## Rescale mechanism: CPU job vs GPU job vs GPU job with contexts on the critical path",
    "",
    "The same job (1 PE per node; `bench_rescale`) with its blocks on the CPU or on the GPU; ms, medians. "
    "`gpu context` and `gpu staging` are parts of the stages (reentry; evacuate/balance), not extra. "
    "`restart` is the same operation by `--mode restart` (checkpoint, every process relaunched, restore: "
    "a GPU job's new processes create their contexts and compile their kernels again).",
    "",
    "| job | op | mechanism | reentry | of which gpu context | gpu staging | evacuate/balance | restart | restart / live |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|",
]
timing = {}
for name, label in [("cpu", "CPU"), ("gpu", "GPU"), ("gpu-ctx", "GPU, contexts re-created at re-entry")]:
    b = bench(name)
    if not b or not b.get("runs"):
        check(f"rescale timings {name}", False, "no results")
        continue
    run = b["runs"][0]
    check(f"rescale timings {name}: checksum agrees", run["job"]["checksums_agree"], run["job"]["checksum"])
    if run.get("restart_failure"):
        check(f"rescale timings {name}: --mode restart", False, run["restart_failure"])
    for op in run["ops"]:
        gpu = {"context": [], "staging": []}
        for r in op["rescales"]:
            got = {g["stage"]: g["ms"] for g in r["report"].get("gpu", [])}
            for k in gpu:
                gpu[k].append(got.get(k, 0.0))
        row = {
            "mechanism_ms": dig(op, "mechanism_ms", "median"),
            "reentry_ms": dig(op, "stages_ms", "reentry", "median"),
            "gpu_context_ms": med(gpu["context"]),
            "gpu_staging_ms": med(gpu["staging"]),
            "lb_ms": dig(op, "lb_ms", "median"),
            "restart_ms": dig(op, "restart_ms", "samples_stats", "median"),
            "restart_over_live": op.get("ratio_restart_to_mechanism"),
        }
        timing[f"{name}/{op['op']}"] = row
        md.append(
            f"| {label} | {op['op']} {op['from_nodes']}->{op['to_nodes']} | {fmt(row['mechanism_ms'])} | {fmt(row['reentry_ms'])} | "
            f"{fmt(row['gpu_context_ms'])} | {fmt(row['gpu_staging_ms'])} | {fmt(row['lb_ms'])} | {fmt(row['restart_ms'], 0)} | "
            f"{fmt(row['restart_over_live'], 0)}x |"
        )
results["rescale"] = timing
md.append("")

# newcomers' context creation (GPU job): processes that are not launch nodes
gb = bench("gpu")
if gb and gb.get("runs"):
    launch = set(gb["runs"][0]["job"]["launch_pids"])
    nprocs = gpu_logs("gpu")
    new = [p["ready"][0] for pid, p in nprocs.items() if pid not in launch and p["ready"]]
    old = [p["ready"][0] for pid, p in nprocs.items() if pid in launch and p["ready"]]
    results["newcomer_context"] = {"newcomers": new, "launch_nodes": old}
    md += [
        "Context creation at node start (before a newcomer registers, so never on a rescale's critical path), ms, medians:",
        "",
        "| processes | n | contexts (driver init + primary context) | NVRTC compile | module load | all GPU start |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, xs in [("newcomers", new), ("launch nodes", old)]:
        md.append(
            f"| {label} | {len(xs)} | {fmt(med([x['context_ms'] for x in xs]))} | {fmt(med([x['compile_ms'] for x in xs]))} | "
            f"{fmt(med([x['load_ms'] for x in xs]))} | {fmt(med([x['total_ms'] for x in xs]))} |"
        )
    check("newcomer context times logged", len(new) > 0, f"{len(new)} newcomers with a gpu ready line")
    md.append("")

# ------------------------------------------------------------ metrics
def samples(text):
    """Prometheus text -> {'name{labels}': value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


before, after = samples(read(f"{work}/metrics-before.txt")), samples(read(f"{work}/metrics-after.txt"))
results["metrics"] = {"before": before, "after": after}
if after:
    keys = [
        "ductile_gpu_devices",
        "ductile_gpu_contexts_created_total",
        'ductile_gpu_start_seconds{step="context"}',
        'ductile_rescales_total{outcome="committed"}',
        'ductile_rescale_gpu_seconds_sum{work="staging"}',
        'ductile_rescale_gpu_seconds_sum{work="context"}',
        'ductile_rescale_stage_seconds_sum{stage="evacuate"}',
        "ductile_rescale_mechanism_seconds_sum",
        "ductile_rescale_migrations_total",
    ]
    md += [
        "## Node 0's Prometheus metrics of a GPU job (3 nodes, shrink then expand)",
        "",
        "| metric | before | after |",
        "|---|---:|---:|",
    ]
    md += [f"| `{k}` | {fmt(before.get(k), 4)} | {fmt(after.get(k), 4)} |" for k in keys]
    md.append("")
devices = after.get("ductile_gpu_devices")
check(
    "metrics: contexts never re-created",
    devices is not None and after.get("ductile_gpu_contexts_created_total") == devices == before.get("ductile_gpu_contexts_created_total"),
    f"devices {devices}, contexts created {before.get('ductile_gpu_contexts_created_total')} -> {after.get('ductile_gpu_contexts_created_total')}",
)
check(
    "metrics: two rescales, GPU staging measured apart",
    after.get('ductile_rescales_total{outcome="committed"}') == 2
    and (after.get('ductile_rescale_gpu_seconds_sum{work="staging"}') or 0) > 0
    and after.get('ductile_rescale_gpu_seconds_sum{work="context"}') == 0,
    str({k: v for k, v in after.items() if "rescale" in k and "bucket" not in k}),
)

# ------------------------------------------------------------ throughput
md += [
    "## Jacobi2D throughput against copy bandwidth",
    "",
    "Each shape ran twice, with few and with many iterations. `ms/iter` is the difference of the two runs' "
    "times over the difference of their iterations, so a run's fixed costs (first allocations, the final "
    "checksum's copy to the host and hash) cancel out; `whole run` is the longer run's time over its "
    "iterations. Effective bandwidth = 16 bytes per point per iteration (one read, one write of a double), "
    "whole iteration included (ghost packing, copies, messages).",
    "",
    "| run | iterations | ms/iter | whole run, ms/iter | Gpoints/s | effective GB/s | of device-to-device copy |",
    "|---|---|---:|---:|---:|---:|---:|",
]
runs = {}
for line in read(f"{work}/throughput.txt").splitlines():
    m = re.search(r"grid=(\d+)x(\d+).*iterations=(\d+) seconds=([\d.]+) time_per_iter_ms=([\d.]+)",
                  line.split("jacobi2d", 1)[-1])
    if m:
        label = " ".join(line.split()[:4])
        runs.setdefault(label, []).append((int(m[3]), float(m[4]), float(m[5]), int(m[1]) * int(m[2])))
tp = []
for label, rs in runs.items():
    rs.sort()
    (n0, s0, _, pts), (n1, s1, whole, _) = rs[0], rs[-1]
    ms = (s1 - s0) * 1e3 / (n1 - n0) if n1 > n0 and s1 > s0 else whole
    gbs = 16 * pts / (ms * 1e-3) / 1e9
    share = gbs / bw["d2d_gbs"] if bw and label.startswith("gpu") else None
    tp.append({"run": label, "iterations": [n0, n1], "ms_per_iter": ms, "whole_run_ms_per_iter": whole,
               "gpoints_s": pts / ms / 1e6, "effective_gbs": gbs, "share_of_d2d": share})
    md.append(f"| {label} | {n0}, {n1} | {ms:.3f} | {whole:.3f} | {pts / ms / 1e6:.2f} | {gbs:.1f} | "
              f"{fmt(share * 100 if share else None, 0)}{'%' if share else ''} |")
results["throughput"] = tp
check("throughput measured", len(tp) >= 4, f"{len(tp)} runs")
md.append("")

md += ["## Checks", ""]
for name, c in results["checks"].items():
    md.append(f"- {'PASS' if c['ok'] else '**FAIL**'} {name}" + ("" if c["ok"] else f": {c['detail']}"))
md.append("")
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("\n".join(md))
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(results, f, indent=1, default=str)
sys.exit(1 if failed else 0)
