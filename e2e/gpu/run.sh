#!/usr/bin/env bash
# The GPU checks of issue 7, as ONE script for a machine with an NVIDIA GPU
# (written for the lent H200: 16 cores, no network). About 6 minutes (343 s there).
#
#   e2e/gpu/run.sh                   # results under $OUT (if set) or target/gpu-run
#
# Binaries: with GPU_BIN=DIR (default: .gpu-bin/ when it exists, made on a
# build machine by e2e/gpu/bundle.sh) it uses jacobi2d, ductile,
# bench_rescale and gpu_probe from there; otherwise it builds them with
# `cargo build --release --offline` (which needs a toolchain and the
# dependencies already in ~/.cargo on that machine).
#
# What it shows (docs/gpu.md, "The GPU script"):
#  1. the device and its copy bandwidths (gpu_probe);
#  2. Jacobi2D GPU checksum == CPU checksum (and residual lines), alone and
#     as multi-node jobs, at even and uneven block shapes;
#  3. 20 rescales (10 shrink+expand) of a GPU job: the checksum stays the
#     CPU's, and every process created its contexts once and at exit still
#     had the same context handle and intact device memory (canary);
#  4. rescale mechanism time, GPU job vs CPU job vs GPU job with context
#     creation forced onto the critical path (DUCTILE_GPU_CONTEXT_ON_REENTRY=1),
#     the CPU and GPU jobs' same rescales by --mode restart (checkpoint,
#     relaunch, restore), and newcomers' context creation time;
#     4b. node 0's Prometheus metrics of a GPU job across a shrink and an
#     expand: GPU staging as its own series, contexts never re-created;
#  5. Jacobi2D GPU throughput against the measured copy bandwidth.
# It writes summary.md, results.json, run.log and logs.tar.gz under the
# output folder, prints the summary, and exits 1 if a check failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
OUT="${OUT:-$ROOT/target/gpu-run}"
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/ductile-gpu.XXXXXX)
LOG="$OUT/run.log"
: >"$LOG"
say() { echo "== $*" | tee -a "$LOG" >&2; }
QUICK="${QUICK:-0}" # QUICK=1: smaller problems, fewer repetitions (a smoke run)

# ---------------------------------------------------------------- libraries
# NVRTC comes with the CUDA toolkit (or the nvidia-cuda-nvrtc wheel); the
# driver's libcuda.so is normally on the loader's path already.
# Never a stubs/ folder: its libcuda.so is the link-time stub, and a process
# that loads it first gets CUDA_ERROR_STUB_LIBRARY instead of the driver.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 \
  $(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name 'libnvrtc.so*' -print 2>/dev/null |
    xargs -r -n1 dirname | grep -v '/stubs$' | sort -u | head -5); do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
(nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv) >>"$LOG" 2>&1

# ---------------------------------------------------------------- binaries
BIN="${GPU_BIN:-}"
if [ -z "$BIN" ] && [ -x "$ROOT/.gpu-bin/jacobi2d" ]; then BIN="$ROOT/.gpu-bin"; fi
if [ -z "$BIN" ]; then
  if command -v cargo >/dev/null; then
    say "building (cargo build --release --offline)"
    if ! cargo build --release --offline -p ductile-apps -p ductile-operator --bins >>"$LOG" 2>&1; then
      say "BUILD FAILED (offline: are the dependencies in ~/.cargo? else run e2e/gpu/bundle.sh on a build machine and carry .gpu-bin)"
      tail -30 "$LOG"
      exit 2
    fi
    BIN="$ROOT/target/release"
  else
    say "no binaries: no cargo here and no .gpu-bin (run e2e/gpu/bundle.sh on a build machine and carry .gpu-bin)"
    exit 2
  fi
fi
for b in jacobi2d ductile bench_rescale gpu_probe; do
  [ -x "$BIN/$b" ] || { say "missing $BIN/$b"; exit 2; }
done
say "binaries: $BIN"
# The kernels: compiled by NVRTC at node start where the machine has NVRTC,
# else loaded from the PTX that bundle.sh made (DUCTILE_GPU_PTX_DIR).
KERNELS="NVRTC at node start"
if ! ldconfig -p 2>/dev/null | grep -q libnvrtc &&
  ! find ${LD_LIBRARY_PATH//:/ } -maxdepth 1 -name 'libnvrtc.so*' 2>/dev/null | grep -q .; then
  if [ -f "$BIN/ptx/jacobi2d.ptx" ]; then
    export DUCTILE_GPU_PTX_DIR="$BIN/ptx"
    KERNELS="shipped PTX ($DUCTILE_GPU_PTX_DIR, made by NVRTC 12.4 on the build machine)"
  else
    say "no NVRTC on this machine and no shipped PTX in $BIN/ptx: the GPU programs cannot load their kernels"
  fi
fi
# Preflight: one tiny GPU run. If NVRTC's PTX is newer than the driver can
# JIT (CUDA_ERROR_UNSUPPORTED_PTX_VERSION) or NVRTC fails, fall back to the
# shipped PTX (ISA 8.4) rather than lose every GPU check.
preflight() {
  DUCTILE_PES=1 timeout 120 "$BIN/jacobi2d" --gpu --grid 64 --block 32 --iters 2 --quiet \
    >"$WORK/preflight.out" 2>"$WORK/preflight.err"
}
if ! preflight; then
  say "preflight GPU run failed: $(tail -c 400 "$WORK/preflight.err")"
  if [ -z "${DUCTILE_GPU_PTX_DIR:-}" ] && [ -f "$BIN/ptx/jacobi2d.ptx" ] &&
    grep -qiE "ptx|nvrtc|compile" "$WORK/preflight.err"; then
    export DUCTILE_GPU_PTX_DIR="$BIN/ptx"
    KERNELS="shipped PTX ($DUCTILE_GPU_PTX_DIR), after NVRTC's failed: $(grep -oiE '[^ ]*(ptx|nvrtc)[^.]*' "$WORK/preflight.err" | head -1)"
    preflight || say "preflight with shipped PTX failed too: $(tail -c 400 "$WORK/preflight.err")"
  fi
fi
cat "$WORK/preflight.err" >>"$LOG"
if grep -qE "no CUDA driver|no CUDA device" "$WORK/preflight.err"; then
  say "no usable GPU here (see above): nothing to check"
  exit 2
fi
say "kernels: $KERNELS"
echo "$KERNELS" >"$WORK/kernels.txt"
export DUCTILE_LOG="${DUCTILE_LOG:-warn,ductile::gpu=info}"
FAILED=0
fail() { say "FAILED: $*"; FAILED=1; }

# ---------------------------------------------------------------- 1. bandwidth
say "1. copy bandwidth (gpu_probe)"
timeout 120 "$BIN/gpu_probe" --bytes $((1 << 30)) --reps 10 >"$WORK/bandwidth.json" 2>>"$LOG" ||
  fail "gpu_probe"
cat "$WORK/bandwidth.json" | tee -a "$LOG"

# ---------------------------------------------------------------- 2. checksums
say "2. Jacobi2D: GPU checksum == CPU checksum"
: >"$WORK/checksums.txt"
check_pair() { # name, runner (alone|job), args...
  local name=$1 how=$2
  shift 2
  local cpu gpu
  for dev in cpu gpu; do
    local extra=()
    [ $dev = gpu ] && extra=(--gpu)
    if [ "$how" = alone ]; then
      DUCTILE_PES=4 timeout 300 "$BIN/jacobi2d" "$@" "${extra[@]}" >"$WORK/$name.$dev.out" 2>>"$LOG"
    else
      timeout 300 "$BIN/ductile" run --nodes 2 --pes-per-node 2 --state-dir "$WORK/st-$name-$dev" --timeout 280 \
        -- "$BIN/jacobi2d" "$@" "${extra[@]}" >"$WORK/$name.$dev.out" 2>>"$LOG"
    fi
    local rc=$?
    [ $rc = 0 ] || fail "$name on $dev exited $rc"
  done
  cpu=$(grep -o 'checksum=[0-9a-f]*' "$WORK/$name.cpu.out" | tail -1)
  gpu=$(grep -o 'checksum=[0-9a-f]*' "$WORK/$name.gpu.out" | tail -1)
  local same_res=yes
  # Iteration and residual only: the lines also carry iterations/s, which differ.
  residuals() { grep -o '^iteration [0-9]* residual [^ ]*' "$1"; }
  [ -n "$(residuals "$WORK/$name.cpu.out")" ] || same_res=no
  cmp -s <(residuals "$WORK/$name.cpu.out") <(residuals "$WORK/$name.gpu.out") || same_res=no
  local c=${cpu#checksum=} g=${gpu#checksum=}
  echo "$name ${c:--} ${g:--} $same_res" >>"$WORK/checksums.txt"
  if [ -z "$cpu" ] || [ "$cpu" != "$gpu" ] || [ $same_res != yes ]; then
    fail "$name: cpu $cpu, gpu $gpu, residual lines equal: $same_res"
  fi
}
check_pair even-alone alone --grid 2048 --block 512 --iters 300 --residual-every 50
check_pair uneven-alone alone --grid 1000x777 --block 128x100 --iters 200 --residual-every 25
check_pair uneven-job job --grid 1500x1100 --block 200x160 --iters 200 --residual-every 40
check_pair lb-job job --grid 1024 --block 128 --iters 200 --residual-every 50 --lb-every 40 +lb GreedyRefine
cat "$WORK/checksums.txt" | tee -a "$LOG"

# ---------------------------------------------------------------- 3+4. rescales
REPS=5
[ "$QUICK" = 1 ] && REPS=2
bench() { # name, extra bench_rescale args...
  local name=$1
  shift
  say "bench_rescale $name"
  timeout 400 "$BIN/bench_rescale" --child-timeout 300 --out "$WORK/rescale-$name.json" \
    --keep-logs "$WORK/logs-$name" "$@" >"$WORK/rescale-$name.txt" 2>>"$LOG"
  local rc=$?
  cat "$WORK/rescale-$name.txt" >>"$LOG"
  [ $rc = 0 ] || fail "bench_rescale $name exited $rc"
}
say "3. 20 rescales of a GPU job (3 nodes, shrink+expand x10)"
bench survive --nodes 3 --reps $((QUICK == 1 ? 3 : 10)) --grid 2048 --block 256 --job-seconds 20 \
  --program-args "--gpu" --no-restart
say "4. rescale mechanism: CPU job, GPU job, GPU job with contexts on the critical path"
bench cpu --nodes 4 --reps $REPS --grid 4096 --block 512 --job-seconds 15
bench gpu --nodes 4 --reps $REPS --grid 4096 --block 512 --job-seconds 15 --program-args "--gpu"
DUCTILE_GPU_CONTEXT_ON_REENTRY=1 bench gpu-ctx --nodes 4 --reps $REPS --grid 4096 --block 512 \
  --job-seconds 15 --program-args "--gpu" --no-restart

# ---------------------------------------------------------------- 4b. metrics
say "4b. a GPU job's Prometheus metrics (node 0) across a shrink and an expand"
ST="$WORK/st-metrics"
"$BIN/ductile" run --nodes 3 --state-dir "$ST" --metrics-port 0 --timeout 200 \
  -- "$BIN/jacobi2d" --gpu --grid 4096 --block 512 --iters 100000000 --quiet >"$WORK/metrics-job.out" 2>>"$LOG" &
MJ=$!
for _ in $(seq 300); do [ -f "$ST/metrics.addr" ] && [ -f "$ST/control.addr" ] && break; sleep 0.2; done
scrape() { # file
  python3 -c 'import sys, urllib.request
print(urllib.request.urlopen("http://" + sys.argv[1] + "/metrics", timeout=10).read().decode(), end="")' \
    "$(cat "$ST/metrics.addr" 2>/dev/null)" >"$1" 2>>"$LOG" || fail "scraping node 0's metrics"
}
scrape "$WORK/metrics-before.txt"
for op in shrink expand; do
  timeout 150 "$BIN/ductile" $op --nodes 1 --state-dir "$ST" --timeout 120 >>"$LOG" 2>&1 || fail "metrics job: $op"
done
scrape "$WORK/metrics-after.txt"
kill "$MJ" 2>/dev/null
wait "$MJ" 2>/dev/null
cat "$WORK/metrics-after.txt" >>"$LOG"

# ---------------------------------------------------------------- 5. throughput
say "5. Jacobi2D GPU throughput"
# Each shape runs twice, SHORT and LONG iterations: a run's time includes
# fixed costs (the first sweep's allocations, the final checksum, which
# copies the grid to the host and hashes it on one core), so the cost of an
# iteration is the difference of the two runs over the difference of
# their iterations. The whole run's figure is kept beside it.
: >"$WORK/throughput.txt"
N=16384
SHORT=100
LONG=1000
[ "$QUICK" = 1 ] && { N=8192; SHORT=50; LONG=300; }
tp_run() { # device pes grid block iters
  local dev=$1 pes=$2 grid=$3 block=$4 iters=$5 extra=()
  [ "$dev" = gpu ] && extra=(--gpu)
  DUCTILE_PES=$pes timeout 300 "$BIN/jacobi2d" "${extra[@]}" --grid "$grid" --block "$block" --iters "$iters" \
    --residual-every 0 --quiet >"$WORK/tp.out" 2>>"$LOG" || fail "throughput run $dev $pes $grid $block $iters"
  echo "$dev pes=$pes grid=$grid block=$block $(grep '^jacobi2d ' "$WORK/tp.out")" | tee -a "$WORK/throughput.txt" >>"$LOG"
}
for spec in "1 $N 4096" "1 $N $N" "4 $N 4096" "1 8192 2048"; do
  set -- $spec
  tp_run gpu "$1" "$2" "$3" $SHORT
  tp_run gpu "$1" "$2" "$3" $LONG
done
tp_run cpu 16 8192 512 10
tp_run cpu 16 8192 512 40

# ---------------------------------------------------------------- summary
python3 "$ROOT/e2e/gpu/summarize.py" "$WORK" "$OUT" || fail "summarize"
tar czf "$OUT/logs.tar.gz" -C "$WORK" . 2>>"$LOG"
cat "$OUT/summary.md"
[ $FAILED = 0 ] && say "all GPU checks passed" || say "SOME GPU CHECKS FAILED (see $OUT/run.log)"
exit $FAILED
