"""Per-kernel times from `ncu --metrics gpu__time_duration.sum --csv` (stdin): one line per
kernel launch ("ID name ns"; ss_profile.py's input generation included), then the jss
kernels' times summed per kernel name. Used by the ss_times_ab stage of scripts/gpu_check.sh."""
import csv
import sys


def main():
    hdr, seen = None, []
    for r in csv.reader(line for line in sys.stdin if not line.startswith("==")):
        if "Kernel Name" in r:
            hdr = r
        elif hdr and len(r) == len(hdr):
            d = dict(zip(hdr, r))
            if d.get("Metric Name") == "gpu__time_duration.sum":
                seen.append((d["ID"], d["Kernel Name"], float(d["Metric Value"].replace(",", ""))))
    total = {}
    for kid, name, ns in seen:
        print(kid, name[:100], f"{ns:,.0f}")
        if "jss::" in name:
            key = name.split("(")[0]
            total[key] = total.get(key, 0.0) + ns
    print("# jss kernels, summed per kernel name over the launches above (us):")
    for k, v in total.items():
        print(f"#   {v / 1e3:9.1f}  {k}")


if __name__ == "__main__":
    main()
