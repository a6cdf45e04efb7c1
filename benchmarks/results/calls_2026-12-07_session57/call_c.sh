#!/usr/bin/env bash
# session 57 call C (call B without mamba_ssm and the package benchmark, for less device time) (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session57 after):
# the warp-specialised forward (cuda/selective_scan_ws.cuh, notes 29) against the staged kernel, in
# one process on the same inputs (ss_fwd_time SS_WS_AB=1, built from b32bd19):
#  1. bitwise agreement, small edge cases: both directions, with / without z, with / without h0 (last
#     state hashed too), padded rows (D = 80), padded states (N = 13), partial last tiles (L = 264, 40, 8);
#  2. compute-sanitizer racecheck / synccheck / memcheck of both kernels on an edge case;
#  3. times at the four benchmark shapes (bf16; medians of 15, two rounds);
#  4. the package (wheel of ab51732): the new GPU tests (bitwise against the staged kernel, gradients) and the
#     forced-lanes / kernel-choice tests;
#  5. ncu (full set, per-instruction table) of the warp-specialised kernel at the bf16 main shape.
cd "$(dirname "$0")/../.."; B=.bin/s57b
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)" PY=python3 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
(cd $B && gunzip -f *.gz && chmod +x ss_fwd_time)
T=$B/ss_fwd_time
{
  for dir in 0 1; do for noz in 0 1; do for h0 in 0 1; do
    echo "--- SS_DIR=$dir SS_NOZ=$noz SS_H0=$h0"
    SS_DIR=$dir SS_NOZ=$noz SS_H0=$h0 SS_WS_AB=1 SS_REPS=2 SS_DTYPES=bfloat16 \
      SS_SHAPES="2,80,264,13 1,64,8,16 1,32,40,16 2,64,1024,16 3,96,2056,16" timeout 25 $T
    rc=$?; echo "rc=$rc"; [[ $rc == 124 ]] && break 3   # a hang: stop here
  done; done; done
} > $R/ws_edge.log 2>&1
if grep -q "rc=124" $R/ws_edge.log; then echo "HANG in the edge cases: WS stages skipped"; cat $R/ws_edge.log; export SKIPWS=1; fi
python3 - $R/ws_edge.log <<'PY' | tee -a $R/ws_edge.log
import re, sys
lines = [l for l in open(sys.argv[1]) if " ws=" in l]
bad = 0; pairs = 0
for a, b in zip(lines[0::2], lines[1::2]):
    ha = re.findall(r"hash (\w+)", a); hb = re.findall(r"hash (\w+)", b)
    pairs += 1
    if ha != hb or "ws=0" not in a or "ws=1" not in b: bad += 1; print("MISMATCH", a.strip(), "|", b.strip())
print(f"edge pairs {pairs}, mismatches {bad}")
PY
[[ -z "${SKIPWS:-}" ]] && {
  for t in racecheck synccheck memcheck; do
    echo "--- $t"
    SS_DIR=1 SS_H0=1 SS_WS_AB=1 SS_REPS=1 SS_DTYPES=bfloat16 SS_SHAPES="2,80,264,13" timeout 150 \
      compute-sanitizer --tool $t --error-exitcode 9 $T 2>&1 | tail -4
    echo "rc=${PIPESTATUS[0]}"
  done
} > $R/ws_sanitize.log 2>&1
cat $R/ws_sanitize.log
[[ -z "${SKIPWS:-}" ]] && {
for round in 1 2; do
  echo "--- round $round"
  SS_WS_AB=1 SS_REPS=15 SS_DTYPES=bfloat16 timeout 90 $T
  SS_WS_AB=1 SS_REPS=15 SS_DTYPES=bfloat16 SS_DIR=1 SS_SHAPES="8,1536,2048,16" timeout 30 $T
done
} > $R/ws_time.log 2>&1
cat $R/ws_time.log
cp $B/jax_selscan-0.1.0-cp312-cp312-linux_x86_64.whl /tmp/ && python3 -m pip install -q --no-deps --force-reinstall /tmp/jax_selscan-0.1.0-cp312-cp312-linux_x86_64.whl > /tmp/pip.log 2>&1 || cat /tmp/pip.log
timeout 150 python3 -P -m pytest -q tests/test_cuda_selective_scan.py -k "warp_specialised or forced_lanes or kernel_choices" \
  -p no:cacheprovider > $R/ws_pytest.log 2>&1; echo "pytest rc=$?"; tail -3 $R/ws_pytest.log
mkdir -p /tmp/bench
[[ -z "${SKIPWS:-}" ]] && SS_SHAPES=8,1536,2048,16 SS_DTYPES=bfloat16 SS_REPS=1 JAX_SELSCAN_SS_FWD_WS=1 timeout 120 ncu --clock-control none -k regex:fwd_ws -c 1 \
  --set full --import-source yes -o /tmp/ws $T > /tmp/bench/ncu_ws_run.txt 2>&1; echo "ncu rc=$?"
ncu --import /tmp/ws.ncu-rep --page details > /tmp/bench/ncu_ws.txt 2>&1
ncu --import /tmp/ws.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > /tmp/bench/ncu_ws_sass.csv.gz
grep -E "Duration|Issue Slots Busy|Registers Per|Achieved Occ|Warp Cycles Per Issued|Executed Ipc A|L1/TEX Cache|Issued Instructions  " /tmp/bench/ncu_ws.txt | head -12
tar -czf $R/bench_ncu.tgz -C /tmp bench
