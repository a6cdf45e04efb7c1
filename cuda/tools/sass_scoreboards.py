"""Which instructions of a tile loop wait for the loop's own prefetch: the check of notes 21
(PERFORMANCE_SELECTIVE_SCAN_CUDA), from the control bits that `cuobjdump -sass` prints.

On sm_70 and later every instruction carries, in bits 41-61 of its second 64-bit word, a stall
count, a yield bit, the scoreboard it sets when its result is written (3 bits, 7 = none), the
one it sets when its sources have been read, and a mask of the scoreboards it waits on (6 bits).
A scoreboard is a counter: waiting on it waits for every operation still counted on it. So when
ptxas lets a shared-memory or math instruction of the walk wait on the scoreboard that the
next tile's global loads also set, the walk waits for those loads, the latency the prefetch
was meant to hide.

For each kernel whose name matches --kernel, the script takes the largest loop (the longest
backward branch), its first two block barriers (stage | walk | write-out in the staged kernels),
the write scoreboards of the global loads still in flight at the first barrier (the prefetch),
and lists the instructions between the two barriers that wait on one of them.
Exit status 1 if any kernel has such a wait.

    nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -Icuda -cubin \\
        cuda/selective_scan_bf16.cu -o /tmp/ss_bf16.cubin
    cuobjdump -sass /tmp/ss_bf16.cubin > /tmp/ss_bf16.sass     # PyPI: nvidia-cuda-cuobjdump
    python3 cuda/tools/sass_scoreboards.py /tmp/ss_bf16.sass --kernel fwd_staged
"""
import argparse
import re
import sys

_FUNC = re.compile(r"^\s*Function : (\S+)")
_INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]+) \*/")
_WORD = re.compile(r"^\s*/\* (0x[0-9a-f]+) \*/")
_BRA = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")


class Insn:
    __slots__ = ("addr", "text", "stall", "wr_sb", "rd_sb", "wait")

    def __init__(self, addr, text, hi):
        ctrl = hi >> 41
        self.addr, self.text = addr, text
        self.stall = ctrl & 0xF
        self.wr_sb = (ctrl >> 5) & 7
        self.rd_sb = (ctrl >> 8) & 7
        self.wait = {b for b in range(6) if (ctrl >> (11 + b)) & 1}


def parse(lines):
    """{function name: [Insn]} from `cuobjdump -sass` text."""
    funcs, cur, pending = {}, None, None
    for line in lines:
        m = _FUNC.match(line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = _INSN.match(line)
        if m and cur is not None:
            pending = (int(m.group(1), 16), m.group(2))
            continue
        m = _WORD.match(line)
        if m and pending is not None:
            cur.append(Insn(pending[0], pending[1], int(m.group(1), 16)))
            pending = None
    return funcs


def walk_waits(insns):
    """(loop, barriers, prefetch scoreboards, [(index, insn) waiting on them in the walk])."""
    index = {x.addr: i for i, x in enumerate(insns)}
    loops = []
    for i, x in enumerate(insns):
        m = _BRA.search(x.text)
        if m and int(m.group(1), 16) < x.addr and int(m.group(1), 16) in index:
            loops.append((index[int(m.group(1), 16)], i))
    if not loops:
        return None
    lo, hi = max(loops, key=lambda ab: ab[1] - ab[0])
    bars = [i for i in range(lo, hi + 1) if insns[i].text.startswith("BAR.SYNC")]
    if len(bars) < 2:
        return (lo, hi), bars, set(), []
    # The scoreboards still counting global loads at the first barrier, in program order from the
    # loop's head (an approximation of the hot path: the cold paths' loads are waited for
    # before the barrier in that order too).
    sbs = set()
    for i in range(lo, bars[0]):
        sbs -= insns[i].wait
        if "LDG" in insns[i].text and insns[i].wr_sb < 7:
            sbs.add(insns[i].wr_sb)
    waits = [(i, insns[i]) for i in range(bars[0] + 1, bars[1]) if insns[i].wait & sbs]
    return (lo, hi), bars, sbs, waits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass", help="cuobjdump -sass output ('-' for stdin)")
    ap.add_argument("--kernel", default="fwd_staged", help="regex on the mangled kernel names")
    ap.add_argument("--show", type=int, default=3, help="waiting instructions to print per kernel")
    args = ap.parse_args()
    lines = sys.stdin if args.sass == "-" else open(args.sass)
    funcs = parse(lines)
    bad = 0
    for name, insns in funcs.items():
        if not re.search(args.kernel, name):
            continue
        r = walk_waits(insns)
        if r is None:
            print(f"{name}: no loop")
            continue
        (lo, hi), bars, sbs, waits = r
        print(f"{name}: loop {lo}-{hi}, barriers {bars[:2]}, prefetch scoreboards {sorted(sbs)}, "
              f"walk instructions waiting on them: {len(waits)}")
        for i, x in waits[:args.show]:
            print(f"    #{i} waits {sorted(x.wait & sbs)}: {x.text}")
        bad += bool(waits)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
