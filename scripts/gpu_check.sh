#!/usr/bin/env bash
# THE one GPU script: build + install the package, GPU tests, compute-sanitizer
# (memcheck, racecheck, synccheck) on small standalone drivers, determinism (500 runs),
# the > 2^31-element checks and the benchmarks. Everything lands under $OUT (default ./out).
#   STAGES="build driver pytest sanitize determinism graph big bench" scripts/gpu_check.sh
# (graph: every kernel family captured in a CUDA graph and replayed, bitwise checked)
# Selective scan: ss_pytest (GPU tests incl. 500-run determinism and > 2^31 elements),
# ss_pytest_rows (the forward/backward tests with the round-1 kernels forced:
# JAX_SELSCAN_SS_FWD=rows JAX_SELSCAN_SS_BWD=rows; SS_PYTEST_K="expr" selects tests of ss_pytest
# with pytest -k),
# ss_sanitize (the three sanitizers on cuda/tools/ss_driver.cu; SS_SAN_TOOLS picks some), ss_ncu_ab (ncu A/B of wheels:
# SS_AB_WHEELS), ss_times_ab (every kernel's ncu time in one fwd and one vjp, per wheel), ss_split (the L split's launch plans and bidirectional vs two calls; SS_SPLIT_STUDIES), ss_bench
# (benchmarks/gpu_selective_scan.py; with mamba_ssm when MAMBA_BUILD=path/to/build.sh,
# an ignored local script, builds it; its code is never part of this repository).
#   (also: DRIVER=prebuilt scan_driver, SS_DRIVER=prebuilt ss_driver, VB_BIN=prebuilt variant_bench,
#    CHECK_ONLY=name (driver check of one kernel), DET_FILTER=substring (determinism cases), BIG_FILTER=substring (> 2^31 cases), SAN_ONLY=row_rounds (sanitize one kernel), SAN_TOOLS / SS_SAN_TOOLS="initcheck" (other sanitizer tools), BENCH_ARGS="--algos auto,lookback_regs --shapes axis",
#    PYTEST_ARGS="-k auto", SAN_LIMIT=seconds, JSS_CPU=ON to build the CPU extension too)
# sharded_gpu (tests/test_sharded.py on 4 GPUs), sync_overhead (how the host waits for a call),
# ss_fwd_ab (forward builds of different -D flags timed side by side, cuda/tools/ss_fwd_time.cu), ss_ws_ab
# (the warp-specialised forward against the staged one, bitwise and timed).
# Also: lds (shared-load wavefronts by lane pattern, cuda/tools/lds_wavefronts.cu),
# variants (cuda/tools/variant_bench.cu, kernel geometries side by side with CUDA
# events; VB_ENV="VB_ROWS=1" picks the shape set, "VB_ONLY=name,name" the variants), variants_ab (prebuilt benches in turn: VB_AB), main_bench (python -m jax_selscan.bench
# and examples/lru_drop_in.py, the README's plot), cpu_bench (the CPU selective-scan
# benchmark and the 1-16 thread scaling curve on this host's cores; needs JSS_CPU=ON;
# CPU_SCALING=0 skips the curve, which measures the host's own ceiling too (--copies; CPU_SCALING_ARGS adds options);
# CPU_BENCH_ARGS="--shapes ..." a subset; JSS_CUDA=OFF builds the CPU extension alone), cpu_probe (the 16-thread kernel
# against 16 one-thread calls in one process, benchmarks/cpu_selective_scan_threads_probe.py; CPU_PROBE_ARGS),
# cpu_prefault (the CPU handlers' prefault of fresh outputs on and off, in one process; needs JSS_CPU=ON).
# Each stage has its own time limit so that a hang cannot eat the whole call.
# Only a few files come back from the device (at most 8 from $OUT; past that, whole files are
# left out, stages.log among them): the stage logs go to $LOGS, kept outside $OUT, and are
# joined into $OUT/stages.log at the end; the benchmark writes its JSON / Markdown into $OUT.
set -u -o pipefail
OUT=${OUT:-$PWD/out}
LOGS=${LOGS:-/tmp/gpu_check_logs}
mkdir -p "$OUT" "$LOGS"
STAGES=${STAGES:-"build driver pytest determinism graph big bench sanitize ss_pytest ss_pytest_rows ss_sanitize ss_bench"}
ARCH=${ARCH:-90}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
has() { [[ " $STAGES " == *" $1 "* ]]; }
status=0
step() {  # step NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc in $(( $(date +%s) - t0 ))s"
  tail -n "${TAIL:-15}" "$LOGS/$name.log"
  [[ $rc -ne 0 ]] && status=1
  return $rc
}

# The commit the results are labelled with. The device copy of the tree may carry stale git
# metadata, so write it here before the call and carry the file:
#   git rev-parse HEAD > .jss_commit   (run(..., carry=[".jss_commit", ...]))
if [[ -z "${JSS_COMMIT:-}" && -f .jss_commit ]]; then JSS_COMMIT=$(cat .jss_commit); fi
export JSS_COMMIT=${JSS_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
export JAX_SELSCAN_COMMIT=$JSS_COMMIT
{
  echo "commit (label) $JSS_COMMIT"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -2
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())"
} > "$LOGS/env.txt" 2>&1
cat "$LOGS/env.txt"

BIN=${BIN:-/tmp/jss_bin}
mkdir -p "$BIN"
# The package builds in the background (pip) while the driver stages run on the GPU.
# DRIVER=path: a scan_driver built elsewhere from this tree (e.g. carried); else built here.
if has build; then
  PIPCMD=($PY -m pip install --no-build-isolation --no-deps -v . -C build-dir=/tmp/jss_build
          -C cmake.define.CMAKE_CUDA_ARCHITECTURES=$ARCH -C cmake.define.JAX_SELSCAN_CUDA=${JSS_CUDA:-ON}
          -C cmake.define.JAX_SELSCAN_CPU=${JSS_CPU:-OFF})
  # PKG_WHEEL=path: install a wheel built elsewhere instead (e.g. from `pip wheel . -w .whl_full
  # -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90` on an x86-64 machine with nvcc, carried:
  # building here takes minutes of device time). Build it in a Python 3.12 venv with jax 0.10.x:
  # a wheel built against jax 0.12's FFI headers (API 0.5) stops jax 0.11 (API 0.4) from starting.
  [[ -n "${PKG_WHEEL:-}" ]] && PIPCMD=($PY -m pip install --no-deps --force-reinstall "$PKG_WHEEL")
  ( t0=$(date +%s); timeout 420 "${PIPCMD[@]}" > "$LOGS/build.log" 2>&1; rc=$?
    echo "=== build rc=$rc in $(( $(date +%s) - t0 ))s" >> "$LOGS/build.log"; exit $rc ) &
  PIP_PID=$!
fi
if has bench; then
  nvcc -O3 -std=c++17 -arch=sm_$ARCH benchmarks/cub_affine_scan.cu -o "$BIN/cub_affine_scan" \
    > "$LOGS/build_cub.log" 2>&1 &
  CUB_PID=$!
fi
if [[ -n "${MAMBA_BUILD:-}" && -f "${MAMBA_BUILD}" ]] && has ss_bench; then
  ( t0=$(date +%s); timeout 400 bash "$MAMBA_BUILD" /tmp/mamba_build > "$LOGS/mamba_build.log" 2>&1; rc=$?
    echo "=== mamba build rc=$rc in $(( $(date +%s) - t0 ))s" >> "$LOGS/mamba_build.log" ) &
  MAMBA_PID=$!
fi
if has ss_sanitize; then
  # SS_DRIVER=path: an ss_driver built elsewhere from this tree (same nvcc line), carried
  SSD=${SS_DRIVER:-$BIN/ss_driver}
  [[ -n "${SS_DRIVER:-}" ]] || nvcc -O2 -std=c++17 -arch=sm_$ARCH -lineinfo -Icuda cuda/tools/ss_driver.cu cuda/selective_scan_f32.cu \
    cuda/selective_scan_bf16.cu cuda/selective_scan_f16.cu cuda/selective_scan_host.cc \
    -o "$SSD" > "$LOGS/build_ss_driver.log" 2>&1 || status=1
  TAIL=4 step ss_driver 120 "$SSD"
  for tool in ${SS_SAN_TOOLS:-memcheck racecheck synccheck}; do
    TAIL=4 step "ss_sanitize_$tool" ${SAN_LIMIT:-150} compute-sanitizer --tool $tool --error-exitcode 9 "$SSD"
  done
fi
DRV=${DRIVER:-}
if [[ -n "$DRV" ]] && ! timeout 30 "$DRV" tiny strided_stage > /dev/null 2>&1; then
  echo "DRIVER=$DRV does not run here: building it"; DRV=
fi
if [[ -z "$DRV" ]] && { has driver || has sanitize || has determinism || has big || has graph; }; then
  nvcc -O2 -std=c++17 -arch=sm_$ARCH -lineinfo --expt-relaxed-constexpr -Icuda cuda/tools/scan_driver.cu \
    cuda/scan_f32.cu cuda/scan_f64.cu cuda/scan_bf16.cu cuda/scan_f16.cu cuda/scan_c64.cu cuda/dispatch.cc \
    -o "$BIN/scan_driver" > "$LOGS/build_driver.log" 2>&1 || status=1
  DRV="$BIN/scan_driver"
fi

if has variants; then
  VB=${VB_BIN:-$BIN/variant_bench}  # VB_BIN=path: a variant_bench built elsewhere from this tree
  [[ -n "${VB_BIN:-}" ]] || nvcc -O3 -std=c++17 -arch=sm_$ARCH --expt-relaxed-constexpr -Icuda cuda/tools/variant_bench.cu \
    cuda/dispatch.cc -o "$VB" > "$LOGS/build_variants.log" 2>&1 || status=1
  TAIL=40 step variants 240 env ${VB_ENV:-} "$VB"
fi
# variants_ab: several variant benches (VB_AB="path1 path2 ...", e.g. a build of the previous
# commit and of this one, carried) run in turn VB_AB_RUNS times (default 2) in this one call,
# each run in its own log (variants_ab_<i>_<name>.log, i counting the runs), with the env VB_ENV.
if has variants_ab; then
  i=0
  for run in $(seq 1 "${VB_AB_RUNS:-2}"); do
    for vb in ${VB_AB:-}; do
      i=$((i + 1)); TAIL=40 step "variants_ab_${i}_$(basename "$vb")" 240 env ${VB_ENV:-} "$vb"
    done
  done
fi
# lds: shared-load wavefronts per warp instruction by lane pattern and width
# (cuda/tools/lds_wavefronts.cu; the table of PERFORMANCE_SELECTIVE_SCAN_CUDA 12.1) into $OUT/lds_wavefronts.md.
if has lds; then
  nvcc -O3 -arch=sm_$ARCH -std=c++17 -Icuda/tools cuda/tools/lds_wavefronts.cu -o "$BIN/lds_wavefronts" \
    > "$LOGS/build_lds.log" 2>&1 || status=1
  TAIL=3 step lds 120 ncu --clock-control none --csv --metrics \
    smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,smsp__sass_inst_executed_op_shared_ld.sum \
    "$BIN/lds_wavefronts"
  $PY cuda/tools/lds_table.py "$LOGS/lds.log" | tee "$OUT/lds_wavefronts.md"
fi
has driver && step driver ${DRIVER_LIMIT:-240} "$DRV" check ${CHECK_ONLY:-}
has determinism && step determinism 240 "$DRV" determinism 500 ${DET_FILTER:-}
if has sanitize; then
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    TAIL=6 step "sanitize_$tool" ${SAN_LIMIT:-150} compute-sanitizer --tool $tool --error-exitcode 9 "$DRV" tiny ${SAN_ONLY:-}
  done
fi
has big && step big 300 "$DRV" big ${BIG_FILTER:-}
has graph && step graph 120 "$DRV" graph 100
if [[ -n "${PIP_PID:-}" ]]; then
  wait $PIP_PID || status=1
  tail -n 3 "$LOGS/build.log"
fi
[[ -n "${CUB_PID:-}" ]] && { wait $CUB_PID || echo "cub build failed"; }
has build && { (cd /tmp && $PY -c "import jax_selscan as j; print('has_cuda_kernels', j.has_cuda_kernels)") || status=1; }
has bench && TAIL=40 step bench 540 $PY -P benchmarks/gpu_linear_scan.py --out "$OUT" --cub "$BIN/cub_affine_scan" ${BENCH_ARGS:-}
has pytest && TAIL=25 step pytest 420 $PY -P -m pytest -q -x tests/test_cuda_linear_scan.py $(ls tests/test_scan_mirrors*.py 2>/dev/null) -p no:cacheprovider ${PYTEST_ARGS:-}
# ss_ncu_ab: the forward (SS_AB_KERNELS, default fwd_staged) under Nsight Compute, the A/B of
# PERFORMANCE_SELECTIVE_SCAN_CUDA 8 and 10: for each wheel of SS_AB_WHEELS ("old.whl new.whl",
# carried) in turn, installed, then ncu over cuda/tools/ss_profile.py per dtype of SS_AB_DTYPES
# (SS_AB_SECTIONS: other ncu --section flags). SS_AB_BENCH="args": also
# benchmarks/gpu_selective_scan.py with these arguments per wheel (results in $OUT/ab_<i>).
# SS_AB_BITS=1: cuda/tools/ss_bits.py per wheel, diffed against the first wheel's.
# SS_AB_VARIANT_ENV="VAR=value ...": after the loop, the same ncu runs once more with these
# variables set (the last wheel; e.g. JAX_SELSCAN_SS_FWD_LANES=4 forces a lane geometry).
# The wheel listed last stays installed for the stages after it.
ss_ncu() {  # ss_ncu NAME DTYPE [VAR=value ...]
  local name=$1 dt=$2; shift 2
  TAIL=${SS_AB_TAIL:-12} step "$name" 300 env SS_PROFILE_DTYPE=$dt "$@" ncu --clock-control none \
    -k regex:"${SS_AB_KERNELS:-fwd_staged}" -c "${SS_AB_COUNT:-2}" \
    ${SS_AB_SECTIONS:---section SpeedOfLight --section WarpStateStats --section InstructionStats} \
    $PY -P cuda/tools/ss_profile.py
}
if has ss_ncu_ab; then
  i=0
  for whl in ${SS_AB_WHEELS:-}; do
    i=$((i + 1))
    $PY -m pip install --no-deps --force-reinstall "$whl" > "$LOGS/ss_ab_install_$i.log" 2>&1 || status=1
    for dt in ${SS_AB_DTYPES:-bfloat16 float32}; do ss_ncu "ss_ncu_ab_${i}_$dt" $dt; done
    [[ -n "${SS_AB_BENCH:-}" ]] && TAIL=30 step "ss_ab_bench_$i" 300 $PY -P benchmarks/gpu_selective_scan.py \
      --out "$OUT/ab_$i" ${SS_AB_BENCH}
    [[ "${SS_AB_BITS:-0}" == 1 ]] && { TAIL=2 step "ss_ab_bits_$i" 200 $PY -P cuda/tools/ss_bits.py; cp "$LOGS/ss_ab_bits_$i.log" "$OUT/bits_$i.txt"; }
  done
  # SS_AB_BITS=1: bitwise fingerprints (cuda/tools/ss_bits.py) per wheel, compared with the first's.
  if [[ "${SS_AB_BITS:-0}" == 1 ]]; then
    for f in "$OUT"/bits_*.txt; do
      if diff -q "$OUT/bits_1.txt" "$f" > /dev/null; then echo "bits: $(basename "$f") same as bits_1.txt"
      else echo "bits: $(basename "$f") DIFFERS from bits_1.txt"; fi
    done | tee "$LOGS/ss_ab_bits.log"
  fi
  if [[ -n "${SS_AB_VARIANT_ENV:-}" ]]; then
    for dt in ${SS_AB_DTYPES:-bfloat16 float32}; do ss_ncu "ss_ncu_ab_variant_$dt" $dt ${SS_AB_VARIANT_ENV}; done
  fi
fi
# ss_times_ab: every kernel of one jitted forward and one jitted vjp (all gradients) with its
# ncu time, per wheel of SS_AB_WHEELS, shape of SS_TIMES_SHAPES and dtype of SS_AB_DTYPES.
if has ss_times_ab; then
  i=0
  for whl in ${SS_AB_WHEELS:-}; do
    i=$((i + 1))
    $PY -m pip install --no-deps --force-reinstall "$whl" > "$LOGS/ss_times_install_$i.log" 2>&1 || status=1
    for sh in ${SS_TIMES_SHAPES:-64,768,512,16 8,1536,2048,16}; do
      for dt in ${SS_AB_DTYPES:-bfloat16 float32}; do
        TAIL=${SS_TIMES_TAIL:-12} step "ss_times_${i}_${sh//,/x}_$dt" 200 bash -c "SS_PROFILE_VJP=1 SS_PROFILE_SHAPE=$sh \
          SS_PROFILE_DTYPE=$dt ncu --clock-control none --metrics gpu__time_duration.sum --csv \
          $PY -P cuda/tools/ss_profile.py | $PY cuda/tools/ncu_kernel_times.py"
      done
    done
  done
fi
has ss_pytest && JAX_SELSCAN_BIG_TESTS=${SS_BIG:-1} JAX_SELSCAN_DETERMINISM_RUNS=${SS_RUNS:-500} TAIL=25 \
  step ss_pytest ${SS_PYTEST_LIMIT:-540} $PY -P -m pytest -q tests/test_cuda_selective_scan.py -p no:cacheprovider \
  ${SS_PYTEST_K:+-k "$SS_PYTEST_K"} ${SS_PYTEST_ARGS:-}
# The round-1 kernels (still used where the staged ones do not apply): the GPU tests with them forced.
has ss_pytest_rows && JAX_SELSCAN_SS_FWD=rows JAX_SELSCAN_SS_BWD=rows JAX_SELSCAN_DETERMINISM_RUNS=${SS_RUNS:-500} TAIL=25 \
  step ss_pytest_rows ${SS_PYTEST_LIMIT:-540} $PY -P -m pytest -q tests/test_cuda_selective_scan.py -p no:cacheprovider \
  -k "not choices and not 2_31" ${SS_PYTEST_ARGS:-}
if has ss_bench; then
  [[ -n "${MAMBA_PID:-}" ]] && { wait $MAMBA_PID; tail -n 5 "$LOGS/mamba_build.log"; }
  MAMBA_ARGS=(); [[ -d /tmp/mamba_build ]] && MAMBA_ARGS=(--mamba-dir /tmp/mamba_build)
  [[ -f benchmarks/gpu_selective_scan.py ]] && TAIL=60 step ss_bench 540 $PY -P benchmarks/gpu_selective_scan.py \
    --out "$OUT" "${MAMBA_ARGS[@]}" ${SS_BENCH_ARGS:-}
fi
# The L split's chunk counts and the forward's lanes side by side at few-row shapes, and the
# bidirectional call against two directional ones (benchmarks/gpu_selective_scan_split.py).
if has ss_split; then  # one run per study of SS_SPLIT_STUDIES (plans, sub, lanes)
  for study in ${SS_SPLIT_STUDIES:-plans}; do
    TAIL=40 step ss_split_$study ${SS_SPLIT_LIMIT:-420} $PY -P benchmarks/gpu_selective_scan_split.py \
      --out "$OUT" --study $study ${SS_SPLIT_ARGS:-}
  done
fi
# ss_fwd_ab: the selective-scan forward alone (cuda/tools/ss_fwd_time.cu), one build per value of
# SS_FWD_AB_FLAGS (default: JSS_SS_FWD_OVERLAP=0, 1, 2; notes 28), each run in turn SS_FWD_AB_ROUNDS
# times (default 2): medians of SS_REPS launches and the output's hash per dtype and shape
# (SS_SHAPES, SS_DTYPES pick them).
if has ss_fwd_ab; then
  AB_FLAGS=${SS_FWD_AB_FLAGS:-JSS_SS_FWD_OVERLAP=0 JSS_SS_FWD_OVERLAP=1 JSS_SS_FWD_OVERLAP=2}
  i=0
  for fl in $AB_FLAGS; do
    i=$((i + 1))
    nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_$ARCH --expt-relaxed-constexpr -D$fl -Icuda cuda/tools/ss_fwd_time.cu \
      cuda/selective_scan_f32.cu cuda/selective_scan_bf16.cu cuda/selective_scan_f16.cu cuda/selective_scan_host.cc \
      -o "$BIN/ss_fwd_time_$i" > "$LOGS/build_ss_fwd_time_$i.log" 2>&1 &
  done
  wait
  for round in $(seq ${SS_FWD_AB_ROUNDS:-2}); do
    i=0
    for fl in $AB_FLAGS; do
      i=$((i + 1))
      TAIL=12 step "ss_fwd_ab_${round}_$i" 120 bash -c "echo '-D$fl'; $BIN/ss_fwd_time_$i"
    done
  done
fi
# ss_ws_ab: the warp-specialised 16-bit forward (notes 29) against the staged kernel's 4 lanes, in
# one process on the same inputs (ss_fwd_time SS_WS_AB=1): edge cases in every direction / z / h0
# combination (the hashes must agree pairwise), then the four benchmark shapes timed.
if has ss_ws_ab; then
  nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_$ARCH --expt-relaxed-constexpr -Icuda cuda/tools/ss_fwd_time.cu \
    cuda/selective_scan_f32.cu cuda/selective_scan_bf16.cu cuda/selective_scan_f16.cu cuda/selective_scan_host.cc \
    -o "$BIN/ss_fwd_time_ws" > "$LOGS/build_ss_fwd_time_ws.log" 2>&1
  TAIL=3 step ss_ws_edge 200 bash -c 'for d in 0 1; do for nz in 0 1; do for h in 0 1; do
      SS_DIR=$d SS_NOZ=$nz SS_H0=$h SS_WS_AB=1 SS_REPS=2 SS_DTYPES=bfloat16 JAX_SELSCAN_SS_FWD_LANES=4 \
      SS_SHAPES="2,80,264,13 1,64,8,16 1,32,40,16 8,2560,4096,16" '"$BIN"'/ss_fwd_time_ws || exit 1
    done; done; done | '"$PY"' cuda/tools/ss_hash_pairs.py'
  TAIL=12 step ss_ws_time 120 env SS_WS_AB=1 SS_REPS=15 SS_DTYPES=bfloat16 "$BIN/ss_fwd_time_ws"
fi
# ls_small: the launch-bound linear_scan shapes (2^20 elements): per-call time in a jitted chain
# beside a one-kernel floor, then each kernel's own ncu time (cuda/tools/ls_small.py; LS_SMALL_*).
if has ls_small; then
  TAIL=30 step ls_small_chain 200 $PY -P cuda/tools/ls_small.py chain
  for v in ${LS_SMALL_WHOLE:-}; do  # the same chains with "auto" under JAX_SELSCAN_LS_WHOLE=v
    JAX_SELSCAN_LS_WHOLE=$v LS_SMALL_ALGOS=auto LS_SMALL_FLOOR=0 LS_SMALL_SHAPES=${LS_SMALL_WHOLE_SHAPES:-${LS_SMALL_SHAPES:-}} \
      TAIL=30 step ls_small_whole$v 200 $PY -P cuda/tools/ls_small.py chain
  done
  for v in "" ${LS_SMALL_NCU_WHOLE-${LS_SMALL_WHOLE:-}}; do  # LS_SMALL_NCU_SHAPES / _WHOLE: what is profiled
    JAX_SELSCAN_LS_WHOLE=$v LS_SMALL_SHAPES=${LS_SMALL_NCU_SHAPES:-${LS_SMALL_SHAPES:-}} TAIL=40 step ls_small_ncu$v 200 \
      bash -c "ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      $PY -P cuda/tools/ls_small.py ncu | $PY cuda/tools/ncu_kernel_times.py"
  done
fi
# sync_overhead: how the host waits for a jitted call (block_until_ready against polling
# Array.is_ready; benchmarks/jax_sync_overhead.py, SYNC_PARTS picks its parts). Run after the
# builds so that no compile shares the host's cores with it.
has sync_overhead && TAIL=30 step sync_overhead 240 $PY -P benchmarks/jax_sync_overhead.py --parts ${SYNC_PARTS:-3} ${SYNC_ARGS:-}
# sharded_gpu: tests/test_sharded.py on this machine's GPUs instead of 4 virtual CPU devices
# (needs 4 GPUs: run(kind="nvidia-h200-x4")); the package from the build stage (PKG_WHEEL).
has sharded_gpu && JAX_SELSCAN_SHARDED_PLATFORM=gpu TAIL=30 step sharded_gpu ${SHARDED_LIMIT:-420} \
  $PY -P -m pytest -q tests/test_sharded.py -p no:cacheprovider -rs ${SHARDED_ARGS:-}
if has main_bench; then
  TAIL=40 step main_bench 300 $PY -P -m jax_selscan.bench --out "$OUT/bench_h200.json" ${MAIN_BENCH_ARGS:-}
  TAIL=12 step lru_drop_in 120 $PY -P examples/lru_drop_in.py
fi
if has cpu_bench; then  # CPU only (JAX_PLATFORMS=cpu): the 16 host cores
  JAX_PLATFORMS=cpu TAIL=30 step cpu_bench 300 $PY -P benchmarks/cpu_selective_scan.py --out "$OUT/cpu_selective_scan_host" ${CPU_BENCH_ARGS:-}
  [[ "${CPU_SCALING:-1}" == 1 ]] && JAX_PLATFORMS=cpu TAIL=30 step cpu_scaling 300 $PY -P \
    benchmarks/cpu_selective_scan_scaling.py --copies --out "$OUT/cpu_selective_scan_scaling_host" ${CPU_SCALING_ARGS:-}
fi
# The 16-thread kernel against 16 Python threads running 1-thread shares in the same process.
has cpu_probe && JAX_PLATFORMS=cpu TAIL=12 step cpu_probe 150 $PY -P benchmarks/cpu_selective_scan_threads_probe.py \
  ${CPU_PROBE_ARGS:-}
# cpu_prefault: the handlers' prefault of fresh outputs on and off (JAX_SELSCAN_CPU_PREFAULT=0),
# alternating in one process: the forward at two shapes and forward + backward, accounted per
# thread; then the linear-scan benchmark once with each setting (session 44's call 2).
if has cpu_prefault; then
  PROBE=($PY -P benchmarks/cpu_selective_scan_threads_probe.py --also-env JAX_SELSCAN_CPU_PREFAULT=0)
  JAX_PLATFORMS=cpu TAIL=12 step cpu_prefault_fwd 150 "${PROBE[@]}" --rounds 3
  JAX_PLATFORMS=cpu TAIL=12 step cpu_prefault_fwd_small 100 "${PROBE[@]}" --rounds 3 --shape 1x1536x2048x16
  JAX_PLATFORMS=cpu TAIL=12 step cpu_prefault_grad 200 "${PROBE[@]}" --rounds 2 --grad
  for v in 1 0; do
    JAX_PLATFORMS=cpu JAX_SELSCAN_CPU_PREFAULT=$v TAIL=8 step cpu_prefault_linear_$v 150 \
      $PY -P benchmarks/cpu_linear_scan.py --no-write --assoc-repeats 1
  done
fi
for f in env.txt "$LOGS"/*.log; do
  f=$(basename "$f"); [[ -f "$LOGS/$f" ]] && { echo "##### $f"; cat "$LOGS/$f"; }
done > "$OUT/stages.log" 2>&1
echo "gpu_check status=$status"
exit $status
