#!/usr/bin/env bash
# session 57 call D (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session57 after):
# the warp-specialised forward made the default where it applies (wheel of the working tree after
# ab51732: JAX_SELSCAN_SS_FWD_WS unset = on, off while JAX_SELSCAN_SS_FWD_LANES forces a geometry):
#  1. bitwise agreement with the staged kernel's 4-lane geometry (JAX_SELSCAN_SS_FWD_LANES=4; call C
#     compared against the 8 lanes that the fill rule picks at those shapes, which sum y in another
#     order), the edge cases of call C (ss_fwd_time of b32bd19: its WS switch predates the default);
#  2. tests/test_cuda_selective_scan.py on the new default (the forward-side tests, -k; cut to the device time left);
#  3. mamba_ssm built alongside; the package beside it, bf16, main shape, with the default (WS) and WS=0;
#  4. racecheck of the edge case, its first hazards kept (call C: 38 hazards).
cd "$(dirname "$0")/../.."; B=.bin/s57b
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)" PY=python3 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
( t0=$(date +%s); MAMBA_FP16=0 timeout 400 bash third_party/build_mamba.sh /tmp/mamba_build > /tmp/mamba_build.log 2>&1
  echo "mamba build rc=$? in $(( $(date +%s) - t0 ))s" >> /tmp/mamba_build.log ) &
MPID=$!
(cd $B && gunzip -f ss_fwd_time.gz && chmod +x ss_fwd_time)
T=$B/ss_fwd_time
export JAX_SELSCAN_SS_FWD_LANES=4
{
  for dir in 0 1; do for noz in 0 1; do for h0 in 0 1; do
    echo "--- SS_DIR=$dir SS_NOZ=$noz SS_H0=$h0 JAX_SELSCAN_SS_FWD_LANES=4"
    SS_DIR=$dir SS_NOZ=$noz SS_H0=$h0 SS_WS_AB=1 SS_REPS=2 SS_DTYPES=bfloat16 \
      SS_SHAPES="2,80,264,13 1,32,40,16 8,2560,4096,16" timeout 20 $T
  done; done; done
} > $R/ws_edge.log 2>&1
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
unset JAX_SELSCAN_SS_FWD_LANES
cp $B/jax_selscan-0.1.0-cp312-cp312-linux_x86_64.whl /tmp/ && python3 -m pip install -q --no-deps --force-reinstall /tmp/jax_selscan-0.1.0-cp312-cp312-linux_x86_64.whl > /tmp/pip.log 2>&1 || cat /tmp/pip.log
JAX_SELSCAN_DETERMINISM_RUNS=10 timeout 100 python3 -P -m pytest -q tests/test_cuda_selective_scan.py -p no:cacheprovider -rs \
  -k "warp_specialised or forward or lanes or determinis or streaming or nan or gradients_staged" \
  > $R/ss_pytest.log 2>&1; echo "pytest rc=$?"; grep -E "^FAILED|passed|failed" $R/ss_pytest.log | tail -12
wait $MPID; tail -2 /tmp/mamba_build.log
mkdir -p /tmp/bench/ws_default /tmp/bench/ws0
for w in default 0; do
  if [[ $w == default ]]; then unset JAX_SELSCAN_SS_FWD_WS; else export JAX_SELSCAN_SS_FWD_WS=0; fi
  timeout 40 python3 -P benchmarks/gpu_selective_scan.py --out /tmp/bench/ws_$w --mamba-dir /tmp/mamba_build \
    --impls ours,mamba --dtypes bfloat16 --shapes 8x1536x2048x16 --reps 10 --budget 30 --shape-budget 25 \
    > /tmp/bench/ws_$w/log.txt 2>&1; echo "bench ws=$w rc=$?"
  grep -E "^bfloat16" /tmp/bench/ws_$w/log.txt
done
unset JAX_SELSCAN_SS_FWD_WS
cp /tmp/mamba_build.log /tmp/bench/; tar -czf $R/bench.tgz -C /tmp bench
JAX_SELSCAN_SS_FWD_LANES=4 SS_DIR=1 SS_H0=1 SS_WS_AB=1 SS_REPS=1 SS_DTYPES=bfloat16 SS_SHAPES="2,80,264,13" timeout 40 \
  compute-sanitizer --tool racecheck --print-limit 12 --error-exitcode 9 $T > $R/ws_racecheck.log 2>&1; echo "racecheck rc=$?"
grep -E "Race|hazard|SUMMARY|at .*fwd_ws|Write Thread|Read Thread|Current Value" $R/ws_racecheck.log | head -16

