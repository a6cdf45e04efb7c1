"""Chosen metrics of each kernel launch from `ncu --set full --csv --page details` (a file):
one line per launch, "ID kernel grid | metric=value | ...", then, with a third argument, the
ncu rule texts that contain it (e.g. "sector" for the coalescing rules).
    python3 cuda/tools/ncu_details.py out.csv 'Duration|L2 Hit Rate' sector
Rows whose rule columns are empty are shorter than the header: they are read all the same."""
import csv
import io
import sys


def load(path):
    text = open(path).read()
    text = text[text.index('"ID"'):]  # ncu's own messages come first
    rows = list(csv.reader(io.StringIO(text)))
    col = {h: i for i, h in enumerate(rows[0])}
    metrics, rules = {}, {}
    for r in rows[1:]:
        if len(r) <= col["Metric Value"]:
            continue
        name = r[col["Kernel Name"]].replace("(Dev)", "").replace("void ", "")
        key = (int(r[col["ID"]]), name, r[col["Grid Size"]])
        if r[col["Metric Name"]]:
            metrics.setdefault(key, {})[r[col["Metric Name"]]] = r[col["Metric Value"]]
        rd = col["Rule Description"]
        if len(r) > rd and r[rd]:
            rules.setdefault(key, []).append(r[rd])
    return metrics, rules


def main():
    metrics, rules = load(sys.argv[1])
    wanted = sys.argv[2].split("|")
    for key, m in sorted(metrics.items()):
        print(key[0], key[1][:48], key[2], " | ".join(f"{w}={m.get(w, '-')}" for w in wanted))
    if len(sys.argv) > 3:
        for key, texts in sorted(rules.items()):
            hits = [t for t in texts if sys.argv[3] in t]
            if hits:
                print(key[0], key[1][:48])
                for t in hits:
                    print("   ", t[:300])


if __name__ == "__main__":
    main()
