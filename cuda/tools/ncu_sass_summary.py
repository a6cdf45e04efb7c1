"""Summarise an Nsight Compute per-instruction table (SASS source page as CSV) by loop level.

Every instruction of a loop body executes the same number of times, so grouping the SASS rows
by "Instructions Executed" splits a kernel into its loop levels (the walk's groups, the tile
loop, the prologue) with their share of the instructions and of the warp-stall samples. With
--list N it also prints the N most-stalled instructions of the hottest levels. Used for the
selective-scan profiles of docs/PERFORMANCE_SELECTIVE_SCAN_CUDA.md (sections 6 and 8):

    ncu --clock-control none -k regex:fwd_staged -c 1 --set full --import-source yes -o fwd \\
        python3 -P cuda/tools/ss_profile.py
    ncu --import fwd.ncu-rep --page source --csv --print-source sass | gzip > fwd_sass.csv.gz
    python3 cuda/tools/ncu_sass_summary.py fwd_sass.csv.gz --list 20

--disasm F --function NAME attributes the table to source lines: F is `nvdisasm -c -gi` of a local
build with the same flags and -lineinfo (the wheel has no line info; the opcodes must match one
for one, which is checked), NAME the mangled kernel; --per N divides the counts by N (e.g. the
warp-tiles of a loop level) and --source-lines K shows the K busiest lines (notes 21.1).

--reasons splits each level's stall samples by reason (`no_instruction`: an instruction-cache
miss; PERFORMANCE_CUDA.md 13.2), and --opcodes N lists the N most executed opcodes, per element
when --elements gives the problem's element count (13.6).
"""
import argparse
import collections
import csv
import gzip
import re


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", help="the SASS source page as CSV (.gz or plain)")
    ap.add_argument("--levels", type=int, default=10, help="loop levels to show")
    ap.add_argument("--list", type=int, default=0, help="most-stalled instructions to show")
    ap.add_argument("--reasons", action="store_true", help="each level's stall samples by reason")
    ap.add_argument("--opcodes", type=int, default=0, help="most executed opcodes to show")
    ap.add_argument("--elements", type=float, default=0, help="elements of the problem (opcodes per 32)")
    ap.add_argument("--disasm", help="nvdisasm -c -gi output of the same code, with line info")
    ap.add_argument("--function", help="the kernel's mangled name in --disasm")
    ap.add_argument("--per", type=float, default=1.0, help="divide the per-line counts by this")
    ap.add_argument("--source-lines", type=int, default=25, help="busiest source lines to show")
    args = ap.parse_args()
    opener = gzip.open if args.csv.endswith(".gz") else open
    with opener(args.csv, "rt") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if "Instructions Executed" in r)
    hdr, data = rows[head], rows[head + 1:]
    col = {k: hdr.index(k) for k in ("Source", "Instructions Executed", "Warp Stall Sampling (All Samples)")}
    execd = [int(r[col["Instructions Executed"]] or 0) for r in data]
    stall = [int(r[col["Warp Stall Sampling (All Samples)"]] or 0) for r in data]
    tot, tot_s = sum(execd) or 1, sum(stall) or 1
    print(f"{tot:,} warp-instructions, {tot_s:,} stall samples")
    level = collections.defaultdict(lambda: [0, 0, 0])
    for e, s in zip(execd, stall):
        level[e][0] += 1
        level[e][1] += e
        level[e][2] += s
    ranked = sorted(level.items(), key=lambda kv: -kv[1][1])[:args.levels]
    print(f"{'executions each':>16} {'static':>7} {'instructions':>13} {'stalls':>7}")
    for e, (n, s, st) in ranked:
        print(f"{e:>16,} {n:>7} {s / tot:>12.1%} {st / tot_s:>7.1%}")
    if args.list:
        hot = {e for e, _ in ranked[:3]}
        top = sorted((i for i, e in enumerate(execd) if e in hot), key=lambda i: -stall[i])[:args.list]
        for i in sorted(top):
            print(f"{i:6d} {execd[i]:>10,} {stall[i]:>6} {data[i][col['Source']].strip()[:80]}")
    if args.reasons:
        # per-reason sample columns ("stall_x"; their "(Not Issued)" twins left out)
        rcols = [(k[len("stall_"):], hdr.index(k)) for k in hdr if k.startswith("stall_") and "Not Issued" not in k]
        by_level = collections.defaultdict(collections.Counter)
        for e, r in zip(execd, data):
            for name, j in rcols:
                by_level[e][name] += int(r[j] or 0)
        total = collections.Counter()
        for c in by_level.values():
            total.update(c)
        print("all levels: " + ", ".join(f"{k} {v / tot_s:.1%}" for k, v in total.most_common(8)))
        for e, _ in ranked:
            c = by_level[e]
            print(f"{e:>16,}: " + ", ".join(f"{k} {v / tot_s:.1%}" for k, v in c.most_common(5)))
    if args.disasm:
        by_line(data, execd, stall, tot_s, col["Source"], args)
    if args.opcodes:
        ops = collections.Counter()
        for e, r in zip(execd, data):
            words = [w for w in r[col["Source"]].split() if not w.startswith("@")]  # no predicate
            if words:
                ops[words[0]] += e
        per = args.elements / 32 if args.elements else tot
        unit = "warp-instructions per 32 elements" if args.elements else "of the instructions"
        print(f"opcodes ({unit}):")
        for k, v in ops.most_common(args.opcodes):
            print(f"  {k:32s} {v / per:8.3f}" if args.elements else f"  {k:32s} {v / per:8.1%}")


def disasm_lines(path, function):
    """[(opcode, (file, line))] of one kernel in `nvdisasm -c -gi` output."""
    out, cur, inside = [], None, False
    for line in open(path):
        if re.match(r"^[.\w$]+:\s*$", line):  # a label: the function's own, or a local one
            name = line.strip()[:-1]
            if name == function:
                inside = True
            elif inside and name.startswith("_Z"):
                break
            continue
        if not inside:
            continue
        m = re.match(r'\s*//## File "(.*)", line (\d+)', line)
        if m:
            cur = (m.group(1).rsplit("/", 1)[-1], int(m.group(2)))
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?);", line)
        if m:
            out.append((opcode(m.group(1)), cur))
    return out


def opcode(text):
    words = [w for w in text.split() if not w.startswith("@")]
    return words[0] if words else ""


def by_line(data, execd, stall, tot_s, src_col, args):
    lines = disasm_lines(args.disasm, args.function)
    if len(lines) != len(data):
        raise SystemExit(f"--disasm has {len(lines)} instructions for {args.function}, the table {len(data)}")
    bad = sum(op != opcode(r[src_col]) for (op, _), r in zip(lines, data))
    if bad:
        raise SystemExit(f"{bad} opcodes differ between --disasm and the table: not the same code")
    per = collections.defaultdict(lambda: [0.0, 0, collections.Counter()])
    for (op, where), e, st in zip(lines, execd, stall):
        acc = per[where]
        acc[0] += e / args.per
        acc[1] += st
        acc[2][op.split(".")[0]] += e / args.per
    print(f"source lines (instructions per {args.per:g} executions, share of the stall samples):")
    for where, (n, st, ops) in sorted(per.items(), key=lambda kv: -kv[1][0])[:args.source_lines]:
        f, ln = where if where else ("?", 0)
        top = " ".join(f"{k}:{v:.0f}" for k, v in ops.most_common(5))
        print(f"  {n:8.1f} {st / tot_s:6.1%}  {f}:{ln:<5} {top}")


if __name__ == "__main__":
    main()
