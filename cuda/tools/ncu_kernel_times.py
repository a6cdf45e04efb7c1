"""Per-kernel times from `ncu --metrics gpu__time_duration.sum --csv` (stdin), one line per
kernel launch ("ID name ns"), then the sum per kernel name. Used by the ss_times_ab stage of
scripts/gpu_check.sh; the launches of ss_profile.py's input generation are listed too (plain
XLA fusions before the first jss kernel)."""
import collections
import csv
import sys


def main():
    rows = [r for r in csv.reader(line for line in sys.stdin if not line.startswith("=="))]
    hdr, seen = None, []
    for r in rows:
        if "Kernel Name" in r:
            hdr = r
            continue
        if hdr and len(r) == len(hdr):
            d = dict(zip(hdr, r))
            if d.get("Metric Name") != "gpu__time_duration.sum":
                continue
            ns = float(d["Metric Value"].replace(",", ""))
            seen.append((d["ID"], d["Kernel Name"], ns))
    first = next((i for i, (_, name, _) in enumerate(seen) if "jss::" in name), len(seen))
    for kid, name, ns in seen:
        print(kid, name[:100], f"{ns:,.0f}")
    total = collections.OrderedDict()
    for _, name, ns in seen[first:]:
        key = name.split("(")[0]
        total[key] = total.get(key, 0.0) + ns
    print("# from the first jss kernel on, summed per kernel name (us):")
    for k, v in total.items():
        print(f"#   {v / 1e3:9.1f}  {k}")


if __name__ == "__main__":
    main()
