"""Check ss_fwd_time's SS_WS_AB output: each case prints a ws=0 line then a ws=1 line, and their
hashes (output, and last state when printed) must agree. Reads stdin, echoes the pairs, exits 1 on
any mismatch or an odd line count (scripts/gpu_check.sh stage ss_ws_ab)."""
import re
import sys

lines = [x for x in sys.stdin if " ws=" in x]
sys.stdout.writelines(lines)
bad = len(lines) % 2
for a, b in zip(lines[0::2], lines[1::2]):
    if "ws=0" not in a or "ws=1" not in b or re.findall(r"hash (\w+)", a) != re.findall(r"hash (\w+)", b):
        bad += 1
        print("MISMATCH:", a.strip(), "|", b.strip())
print(f"pairs {len(lines) // 2}, mismatches {bad}")
sys.exit(1 if bad or not lines else 0)
