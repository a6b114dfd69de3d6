#!/usr/bin/env python3
"""Memory creep of a training run, from its metrics.jsonl (issue 53, point 6).

Per epoch, the last window's figures (the rank with the largest resident
set: host_rss, host_counted; the largest rank's mem_reserved) and the
epoch record's mem_held, in MiB; then the least-squares slope of each over
the epochs after a warm-up, with its standard error. A series creeps when
its slope is both more than 3 standard errors above 0 and, over the epochs
measured, more than --tolerance-mib: noise moves RSS either way, a leak
up every epoch (a series that falls does not creep). RSS's noise is not independent from epoch to epoch:
glibc's arenas hold a level for tens of epochs and then move by a MiB or
two (the brain-mask task over 200 epochs: 225 MiB, 223 from epoch 65 to
128, 225 again), so with 20 epochs or more in the fit the slope is taken
over 10 batch means (consecutive blocks' averages), whose standard error
sees those levels, instead of over single epochs, whose does not.

  creep.py METRICS_JSONL|CSV [--warmup N] [--tolerance-mib T] [--csv F]
           [--png F] [--title T] [--check rss,counted,held,reserved]

Prints one line per series; exits 3 when a checked series creeps (1 or
2 for anything else that went wrong: too few epochs, a bad file or
argument).
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SERIES = (("rss", "host_rss"), ("counted", "host_counted"),
          ("held", "mem_held"), ("reserved", "mem_reserved"))


def per_epoch(path):
    """The epochs' figures, and the first epoch with a validation (1-based;
    0: none)."""
    last_window, held, validated = {}, {}, []
    for line in open(path):
        r = json.loads(line)
        if r.get("type") == "window":
            last_window[r["epoch"]] = r
        elif r.get("type") == "epoch":
            held[r["epoch"]] = r["mem_held"]
        elif r.get("type") == "validation":
            validated.append(r["epoch"] + 1)
    rows = []
    for e in sorted(last_window):
        w = last_window[e]
        rows.append({"epoch": e + 1, "rss": w["host_rss"] / 2**20,
                     "counted": w["host_counted"] / 2**20,
                     "held": held.get(e, 0) / 2**20,
                     "reserved": w["mem_reserved"] / 2**20})
    return rows, min(validated, default=0)


def from_csv(path):
    """The rows of a CSV this script wrote (--csv), to fit them again, and
    the warm-up it wrote in its header (as the first validation's epoch)."""
    import csv
    lines = open(path).read().splitlines()
    warmup = 0
    if lines and "warmup=" in lines[0]:
        warmup = int(lines[0].split("warmup=")[1])
    rows = [{"epoch": int(r["epoch"]), "rss": float(r["rss_mib"]),
             "counted": float(r["counted_mib"]), "held": float(r["held_mib"]),
             "reserved": float(r["reserved_mib"])}
            for r in csv.DictReader(lines)]
    return rows, warmup


def slope(xs, ys):
    """Least-squares slope of ys over xs and its standard error."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    resid = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(resid / (n - 2) / sxx) if n > 2 else float("inf")
    return b, se


def fitted_slope(xs, ys):
    """slope() over 10 batch means when there are 20 points or more."""
    if len(xs) < 20:
        return slope(xs, ys)
    k = 10
    edges = [round(i * len(xs) / k) for i in range(k + 1)]
    bx = [sum(xs[a:b]) / (b - a) for a, b in zip(edges, edges[1:])]
    by = [sum(ys[a:b]) / (b - a) for a, b in zip(edges, edges[1:])]
    return slope(bx, by)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("--warmup", type=int, default=-1,
                    help="epochs left out of the fit (default: 10%%, at least 3 "
                    "and the first validation's epoch: its buffers are a step, "
                    "not a creep)")
    ap.add_argument("--tolerance-mib", type=float, default=1.0)
    ap.add_argument("--csv")
    ap.add_argument("--png")
    ap.add_argument("--title", default="")
    ap.add_argument("--check", default="rss,counted,held,reserved")
    a = ap.parse_args()
    rows, first_validation = (from_csv(a.metrics) if a.metrics.endswith(".csv")
                              else per_epoch(a.metrics))
    warmup = (a.warmup if a.warmup >= 0
              else max(3, len(rows) // 10, first_validation))
    fit = rows[warmup:]
    if len(fit) < 5:
        sys.exit(f"creep: {len(rows)} epochs, {warmup} of warm-up: too few to fit")
    if a.csv:
        with open(a.csv, "w") as f:
            # The warm-up in the header: a re-fit of this file uses it.
            f.write(f"epoch,rss_mib,counted_mib,held_mib,reserved_mib,warmup={warmup}\n")
            for r in rows:
                f.write(f"{r['epoch']},{r['rss']:.3f},{r['counted']:.3f},"
                        f"{r['held']:.3f},{r['reserved']:.3f}\n")
    if a.png and a.csv:
        from gnuplot_png import draw
        draw(a.png, f"set title '{a.title}'\nset xlabel 'epoch'\n"
             "set ylabel 'MiB'\nset key outside right\n"
             f"plot '{a.csv}' every ::1 using 1:2 with lines title 'RSS', "
             "'' every ::1 using 1:3 with lines title 'counted', "
             "'' every ::1 using 1:4 with lines title 'held', "
             "'' every ::1 using 1:5 with lines title 'reserved'\n")
    checked = set(a.check.split(","))
    creeping = []
    xs = [r["epoch"] for r in fit]
    print(f"creep: {len(rows)} epochs, fit over epochs {xs[0]}-{xs[-1]} "
          f"(warm-up {warmup}{', 10 batch means' if len(xs) >= 20 else ''}); "
          f"tolerance {a.tolerance_mib} MiB over them")
    for name, _ in SERIES:
        ys = [r[name] for r in fit]
        b, se = fitted_slope(xs, ys)
        drift = b * (xs[-1] - xs[0])
        creeps = b > 3 * se and drift > a.tolerance_mib
        print(f"  {name:8s} {ys[0]:10.2f} -> {ys[-1]:10.2f} MiB (min {min(ys):.2f}, "
              f"max {max(ys):.2f}); slope {b * 1024:+9.2f} KiB/epoch "
              f"(standard error {se * 1024:.2f}); {drift:+.2f} MiB over the fit"
              + ("  CREEPS" if creeps else ""))
        if creeps and name in checked:
            creeping.append(name)
    if creeping:
        print(f"creep: {', '.join(creeping)} grow epoch after epoch",
              file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
