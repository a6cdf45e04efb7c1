"""Markdown table of shared-load wavefronts per warp instruction from the ncu CSV of
cuda/tools/lds_wavefronts.cu (kernels launched pattern by pattern, 4, 8 and 16 bytes each):

    ncu --clock-control none --csv --metrics smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,\\
        smsp__sass_inst_executed_op_shared_ld.sum ./lds_wavefronts > lds.csv
    python3 cuda/tools/lds_table.py lds.csv

The pattern names are read from the tool's own "launched pattern" lines, also in that output.
"""
import csv
import re
import sys

text = open(sys.argv[1]).read()
names = re.findall(r"launched pattern \d+ (\S+)", text)
rows = [r for r in csv.reader(line for line in text.splitlines() if line.startswith('"'))]
head, body = rows[0], rows[1:]
col = {k: head.index(k) for k in ("ID", "Metric Name", "Metric Value")}
per = {}
for r in body:
    per.setdefault(int(r[col["ID"]]), {})[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
print("| lane l reads unit | 4 B | 8 B | 16 B |\n|---|---:|---:|---:|")
for i, name in enumerate(names):
    cells = []
    for w in range(3):
        m = per.get(3 * i + w, {})
        wf = m.get("smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ld.sum")
        ins = m.get("smsp__sass_inst_executed_op_shared_ld.sum")
        cells.append(f"{wf / ins:.2f}" if wf and ins else "-")
    print(f"| {name} | " + " | ".join(cells) + " |")
