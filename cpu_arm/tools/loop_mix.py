"""What a selective-scan kernel's hottest loop compiles to, per ISA (static counts, no timing).

    python cpu_arm/tools/loop_mix.py [--isa neon,avx512] [--function "pass<16, true, true, 0, false>"]
        [--source selective_scan_isa.cc] [--show] [--out FILE.md]

Compiles one kernel source of cpu_arm/ to assembly with the package's optimisation flags
(-O3 -DNDEBUG, the ISA's -m flags; NEON with Debian's aarch64-linux-gnu-g++), finds the
functions whose demangled name contains --function, and in each the basic block with the
most floating-point arithmetic (the inner loop's body, one step over all states for the
forward's `pass`), then prints its instruction mix: FMAs, plain FP ops, register copies,
loads and stores (stack slots apart: spills). It is how PERFORMANCE_CPU's NEON counts were
made: there is no Arm core here to time, and llvm-mca 14 has no Neoverse model.
Needs the compilers and binutils' c++filt.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
ISAS = {  # compiler, flags
    "neon": ("aarch64-linux-gnu-g++", []),
    "avx512": ("g++", ["-mavx512f", "-mavx2", "-mfma", "-mf16c", "-Wno-uninitialized"]),
    "avx2": ("g++", ["-mavx2", "-mfma", "-mf16c"]),
}
FMA = re.compile(r"^(fmla|fmls|fmadd|fmsub|fnmadd|fnmsub|vfn?m(add|sub)\d{3}[ps]s)")
FP = re.compile(r"^(fadd|fsub|fmul|fneg|fdiv|fmax|fmin|vadd[ps]s|vsub[ps]s|vmul[ps]s|vdiv[ps]s|vmax[ps]s|vmin[ps]s|vscalef[ps]s)")
COPY = re.compile(r"^(mov|dup|vmovaps|vmovups|vmovdqa\d*|vmovdqu\d*)$")


def assemble(isa: str, source: str) -> str:
    cxx, flags = ISAS[isa]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "k.s")
        cmd = [cxx, "-std=c++17", "-O3", "-DNDEBUG", f"-DJSS_ISA_NAME={isa}", *flags, "-I", SRC,
               "-S", os.path.join(SRC, source), "-o", out]
        subprocess.run(cmd, check=True)
        return open(out).read()


def functions(asm: str, pattern: str):
    """(demangled name, [instruction lines]) of each function whose name contains pattern."""
    labels = re.findall(r"^(_Z\S*):$", asm, flags=re.M)
    names = subprocess.run(["c++filt"], input="\n".join(labels), capture_output=True,
                           text=True, check=True).stdout.split("\n")
    wanted = {m: n for m, n in zip(labels, names) if pattern in n}
    cur, body = None, []
    for line in asm.split("\n") + ["__end__:"]:
        m = re.match(r"^(\S+):$", line)
        if m and not line.startswith("."):
            if cur is not None:
                yield wanted[cur], body
            cur, body = (m.group(1) if m.group(1) in wanted else None), []
        elif cur is not None:
            body.append(line)


def hottest_block(body):
    blocks, cur = [], []
    for line in body:
        if re.match(r"^\.L\w+:", line):
            blocks.append(cur)
            cur = []
        elif line.startswith("\t") and not line.startswith("\t."):
            cur.append(line.strip())
    blocks.append(cur)
    return max(blocks, key=lambda b: sum(bool(FMA.match(i) or FP.match(i)) for i in b))


def mix(block):
    ops = [i.split()[0] for i in block]
    stack = lambda i: re.search(r"\[sp|\(%rsp\)|\(%rbp\)", i) is not None
    loads = [i for i in block if re.match(r"^(ldr|ldp|ld1)", i) or (i.startswith("vmov") and "(" in i.split(",")[0])]
    stores = [i for i in block if re.match(r"^(str|stp|st1)", i) or (i.startswith("vmov") and "(" in i.split(",")[-1])]
    return dict(instructions=len(block), fma=sum(bool(FMA.match(o)) for o in ops),
                other_fp=sum(bool(FP.match(o)) for o in ops),
                copies=sum(bool(COPY.match(o)) and "(" not in i and "[" not in i for o, i in zip(ops, block)),
                loads=len(loads), stores=len(stores),
                stack_loads=sum(map(stack, loads)), stack_stores=sum(map(stack, stores)),
                by_mnemonic=dict(collections.Counter(ops).most_common()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isa", default="neon,avx512")
    ap.add_argument("--function", default="pass<16, true, true, 0, false>")
    ap.add_argument("--source", default="selective_scan_isa.cc")
    ap.add_argument("--show", action="store_true", help="print the block's instructions too")
    ap.add_argument("--out", default="", help="also write the table as Markdown here")
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", SRC, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    rows = []
    for isa in args.isa.split(","):
        for name, body in functions(assemble(isa, args.source), args.function):
            block = hottest_block(body)
            rows.append((isa, name, mix(block)))
            if args.show:
                print("\n".join(block))
    head = ("| ISA | clone | instructions | FMA | other FP | register copies | loads "
            "(stack) | stores (stack) |\n|---|---|---:|---:|---:|---:|---:|---:|")
    clone = lambda n: " ".join(re.findall(r"\[clone ([^\]]+)\]", n)) or "-"
    lines = [head] + [f"| {isa} | {clone(name)} | "
                      f"{m['instructions']} | {m['fma']} | {m['other_fp']} | {m['copies']} | "
                      f"{m['loads']} ({m['stack_loads']}) | {m['stores']} ({m['stack_stores']}) |"
                      for isa, name, m in rows]
    text = (f"# Hottest block of `{args.function}` in `{args.source}`\n\n"
            f"- date {datetime.date.today()}, commit {commit}; command `python {' '.join(sys.argv)}`\n"
            f"- static counts from the compiler's assembly (-O3 -DNDEBUG), no timing; one row per clone "
            f"GCC made of the function; loads and stores are instructions of their own (x86 FMAs' memory "
            f"operands are not counted), (stack) the spills among them\n\n" + "\n".join(lines) + "\n")
    for isa, name, m in rows:
        text += f"\n{isa}: {m['by_mnemonic']}\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
