#!/usr/bin/env python3
"""scaling_model: time per window and efficiency of a memtrain run on a GPU
cluster, from measured compute and an alpha-beta model of the all-reduce.

  python3 benchmarks/scaling_model.py
      --scaling-csv runs/bench_scaling/bench_scaling.csv
      --allreduce-csv runs/bench_allreduce.sizes.csv [--allreduce-csv ...]
      [--profile name:compute_per_micro_s:grad_bytes[:update_s] ...]
      [--measure-configs] [--memtrain build/memtrain]
      [--gpus 8,16,...,1024] [--accum 1,4,16] [--out runs/scaling_model]

The model (its assumptions, all of them):
  window(N, K) = K * c + u + exposed(N)      (seconds; c: compute of one
                                              micro-step, u: the rest of a
                                              window: update, bookkeeping)
  T_ar(B, N)   = alpha(N) + B * 2(N-1)/N / busbw(N)     (ring all-reduce)
  alpha(N)     = alpha_step * 2 * ceil(log2 N)
  busbw(N)     = busbw_intra for N <= gpus_per_node, else busbw_inter
  exposed      = T_ar(B, N)                           without overlap
               = max(T_ar(min(B, 1 MiB), N), T_ar(B, N) - 2/3 c)  with
                 overlap: buckets but the last (<= 1 MiB) go out during the
                 last micro-step's backward, taken as 2/3 of c
  efficiency   = (K * c + u) / window(N, K)     (weak scaling: the same
                 work per GPU; 1 GPU has no all-reduce)
c and B are per model: measured by bench_scaling (its 1-rank rows), by
--measure-configs (memtrain on each of launch/configs/, 1 rank, synthetic
data of the config's kind and shape), or given with --profile. They are
taken as they were measured: compute measured on a CPU makes a GPU
cluster's communication look cheap; give a profile measured on the GPU
(tests/gpu/run.sh) for GPU figures.

The cluster (V100, DGX-1-like: 8 GPUs a node on NVLink, InfiniBand EDR
between nodes), unless --allreduce-csv fits alpha and busbw instead:
  busbw_intra = 0.8 * 150 GB/s: NVLink 2 on a V100 SXM2, 6 links of 25 GB/s
                each way (NVIDIA's V100 datasheet: 300 GB/s both ways),
                times NCCL's protocol efficiency of about 80% of the line
                rate ("With the protocol overhead (~20%) NCCL can get an
                effective NVLink bandwidth of 370GB/s" of 450: S. Jeaugey,
                NVIDIA, https://github.com/NVIDIA/nccl-tests/issues/212)
  busbw_inter = 0.8 * 4 * 12.5 GB/s: 4 EDR ports (100 Gb/s) per 8 GPUs,
                the same 80%
  alpha_step  = 5 us: an assumption (one NCCL step, kernel launch and
                network hop), not a published figure
Validation: with --allreduce-csv (this machine's measured all-reduce) the
model predicts bench_scaling's multi-rank rows that are not oversubscribed
and prints each error; the target is within 15%. --allreduce-csv may be
given once per rank count (across emulated nodes: each its own ring); a
row takes the fit at its rank count, else at the largest count below it.
Rows whose CPUs carry more threads than the 1-rank row's (bench_scaling's
cpu_load: more ranks than cores, as 4 emulated nodes on 2 cores) are
predicted with their compute and the rest of the window stretched by the
ratio of the two loads (time sharing), the all-reduce as fitted; the
table prints each row's load. Writes OUT/validation.csv: each predicted
row's measured and predicted window and efficiency (bench_scaling's
definition: samples/s at N over N times samples/s at 1).
"""

import argparse
import csv
import json
import math
import os
import subprocess

import gnuplot_png
import sys
import time

MiB = 1 << 20


def ints(text):
    return [int(x) for x in text.split(",") if x]


class Network:
    def __init__(self, alpha_step, busbw_intra, busbw_inter, gpus_per_node, source,
                 ranks=0):
        self.alpha_step = alpha_step
        self.busbw_intra = busbw_intra
        self.busbw_inter = busbw_inter
        self.gpus_per_node = gpus_per_node
        self.source = source
        self.ranks = ranks  # the rank count a fit was measured at

    def allreduce(self, nbytes, n):
        if n <= 1:
            return 0.0
        bw = self.busbw_intra if n <= self.gpus_per_node else self.busbw_inter
        return (self.alpha_step * 2 * math.ceil(math.log2(n))
                + nbytes * 2 * (n - 1) / n / bw)


def v100_cluster():
    return Network(5e-6, 0.8 * 150e9, 0.8 * 4 * 12.5e9, 8,
                   "V100 DGX-1-like: NVLink 2 and 4x EDR line rates x 0.8 (see the file)")


def fit_network(path):
    """Least squares of time = alpha + bytes * 2(n-1)/n / busbw on the
    measured memtrain rows from 1 MiB up (the latency-bound sizes below
    fit alpha better when included: all sizes are used for alpha)."""
    rows = list(csv.DictReader(open(path)))
    if not rows:
        sys.exit(f"scaling_model: {path} has no rows")
    n = int(rows[0]["ranks"])
    if n < 2:
        sys.exit(f"scaling_model: {path} was measured at 1 rank: no all-reduce to fit")
    x = [int(r["bytes"]) * 2 * (n - 1) / n for r in rows]
    y = [float(r["memtrain_us"]) * 1e-6 for r in rows]
    m = len(x)
    mx, my = sum(x) / m, sum(y) / m
    sxx = sum((a - mx) ** 2 for a in x)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    intercept = max(my - slope * mx, 0.0)
    steps = 2 * math.ceil(math.log2(n))
    return Network(intercept / steps, 1.0 / slope, 1.0 / slope, 10 ** 9,
                   f"fitted to {path} ({n} ranks, {m} sizes)", n)


class Profile:
    def __init__(self, name, c, grad_bytes, u, source):
        self.name, self.c, self.grad_bytes, self.u, self.source = name, c, grad_bytes, u, source


def window(p, net, n, k, overlap, share=1.0):
    """share: how much longer compute and the rest take than in p's
    measurement (time sharing of CPUs)."""
    c, u = p.c * share, p.u * share
    t_ar = net.allreduce(p.grad_bytes, n)
    if overlap:
        exposed = max(net.allreduce(min(p.grad_bytes, MiB), n), t_ar - 2.0 / 3.0 * c)
    else:
        exposed = t_ar
    return k * c + u + exposed


def from_scaling_csv(path):
    rows = list(csv.DictReader(open(path)))
    for r in rows:
        for key in ("accum", "ranks", "micro", "oversubscribed", "grad_bytes"):
            r[key] = int(r[key])
        # CSVs written before bench_scaling recorded them.
        r["cpu_load"] = float(r.get("cpu_load") or 1)
        r["hosts"] = int(r.get("hosts") or 1)
        r["efficiency"] = float(r["efficiency"])
        for key in ("window_s", "t_compute_s", "t_comm_exposed_s", "t_data_s",
                    "buckets_early"):
            r[key] = float(r[key])
    return rows


def profile_of(r):
    """A 1-rank row's compute per micro-step and the rest of its window."""
    c = r["t_compute_s"] / r["accum"]
    u = max(r["window_s"] - r["t_compute_s"] - r["t_comm_exposed_s"], 0.0)
    return Profile(f"mlp-{r['mode']}-K{r['accum']}", c, r["grad_bytes"], u,
                   "bench_scaling 1 rank")


def network_for(nets, n):
    """The fit at n ranks, else at the largest count below n, else the
    smallest."""
    below = [m for m in nets if m <= n]
    return nets[max(below)] if below else nets[min(nets)]


def validate(rows, nets, overlap):
    """Predicts the multi-rank rows (not oversubscribed) from the 1-rank row
    of the same micro-batch and K (strong scaling's smaller micro-batches
    have 1-rank "calibration" rows); overlap as the measured run did it
    (buckets started in backward), unless `overlap` is False."""
    results = []
    for r in rows:
        if r["ranks"] == 1 or r["oversubscribed"]:
            continue
        one = [b for b in rows if b["ranks"] == 1 and b["micro"] == r["micro"]
               and b["accum"] == r["accum"]]
        if not one:
            continue
        p = profile_of(one[0])
        p.grad_bytes = r["grad_bytes"]
        ov = overlap and float(r.get("buckets_early", 0)) > 0
        predicted = window(p, network_for(nets, r["ranks"]), r["ranks"], r["accum"], ov,
                           r["cpu_load"] / one[0]["cpu_load"])
        results.append((r, predicted, predicted / r["window_s"] - 1.0))
    return results


def measure_configs(memtrain, out):
    """1 rank, 4 windows of each launch/configs/*.yaml on synthetic data of
    its kind: compute per micro-step and gradient bytes."""
    here = os.path.dirname(os.path.abspath(__file__))
    configs = os.path.join(here, "..", "launch", "configs")
    profiles = []
    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(configs)):
        if not name.endswith(".yaml"):
            continue
        cfg_path = os.path.join(configs, name)
        model, section = "mlp", ""
        for line in open(cfg_path):
            if line and not line[0].isspace() and line.rstrip().endswith(":"):
                section = line.strip()[:-1]
            elif section == "model" and line.strip().startswith("name:"):
                model = line.split(":", 1)[1].split("#")[0].strip()
        kind = {"mlp": "features", "cnn": "images", "unet3d": "volumes"}[model]
        data = os.path.join(out, f"{kind}.h5")
        if not os.path.exists(data):
            args = [memtrain, "make-data", "--kind", kind, "--out", data]
            args += (["--samples", "4", "--depth", "48", "--height", "48", "--width", "48"]
                     if kind == "volumes" else ["--samples", "256"])
            subprocess.run(args, check=True, capture_output=True)
        run_dir = os.path.join(out, name[:-5])
        subprocess.run(["rm", "-rf", run_dir], check=True)
        cmd = ["mpirun", "-np", "1", memtrain, "train", "--config", cfg_path,
               f"--data.train={data}", "--data.val=", "--training.max_windows=4",
               "--training.epochs=1000", f"--output.dir={run_dir}",
               "--output.progress=lines"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"# --measure-configs: {name} did not run: {p.stdout[-400:]}{p.stderr[-400:]}")
            continue
        w = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))
             if '"window"' in l][1:]
        c = sorted(x["t_compute_s"] / x["accum_steps"] for x in w)[len(w) // 2]
        u = sorted(max(x["window_s"] - x["t_compute_s"] - x["t_comm_exposed_s"], 0) for x in w)[len(w) // 2]
        profiles.append(Profile(name[:-5], c, w[0]["allreduce_bytes"], u,
                                f"measured: {name}, 1 rank, micro-batch {w[0]['micro_batch']}"))
    return profiles


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scaling-csv", default="")
    ap.add_argument("--allreduce-csv", action="append", default=[])
    ap.add_argument("--profile", action="append", default=[])
    ap.add_argument("--measure-configs", action="store_true")
    ap.add_argument("--memtrain", default="build/memtrain")
    ap.add_argument("--gpus", type=ints, default=[8, 16, 32, 64, 128, 256, 512, 1024])
    ap.add_argument("--accum", type=ints, default=[1, 4, 16])
    ap.add_argument("--no-overlap-validation", action="store_true",
                    help="the measured runs had dist.overlap=false")
    ap.add_argument("--out", default="runs/scaling_model")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    print(f"# scaling_model: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")

    worst = 0.0
    rows = from_scaling_csv(a.scaling_csv) if a.scaling_csv else []
    if rows and a.allreduce_csv:
        nets = {}
        for path in a.allreduce_csv:
            net = fit_network(path)
            if net.ranks in nets:
                sys.exit(f"scaling_model: two --allreduce-csv at {net.ranks} ranks: "
                         f"{nets[net.ranks].source} and {path}")
            nets[net.ranks] = net
            print(f"# validation network at {net.ranks} ranks: alpha_step "
                  f"{net.alpha_step * 1e6:.2f} us, busbw {net.busbw_intra / 1e9:.3f} GB/s, "
                  f"{net.source}")
        print("%-6s %3s %6s %5s %9s %6s %11s %12s %8s" % (
            "mode", "K", "ranks", "hosts", "cpu_load", "micro", "measured_s", "predicted_s",
            "error"))
        val_csv = os.path.join(a.out, "validation.csv")
        with open(val_csv, "w") as f:
            f.write("mode,accum,ranks,hosts,cpu_load,micro,measured_s,predicted_s,error,"
                    "measured_efficiency,predicted_efficiency\n")
            for r, pred, err in validate(rows, nets, not a.no_overlap_validation):
                worst = max(worst, abs(err))
                print("%-6s %3d %6d %5d %9.2f %6d %11.4f %12.4f %+7.1f%%" % (
                    r["mode"], r["accum"], r["ranks"], r["hosts"], r["cpu_load"],
                    r["micro"], r["window_s"], pred, 100 * err))
                eff = r["efficiency"]  # the window's time scales it inversely
                f.write(f"{r['mode']},{r['accum']},{r['ranks']},{r['hosts']},"
                        f"{r['cpu_load']},{r['micro']},{r['window_s']},{pred},{err},"
                        f"{eff},{eff * r['window_s'] / pred}\n")
        skipped = sum(1 for r in rows if r["ranks"] > 1 and r["oversubscribed"])
        if skipped:
            print(f"# {skipped} oversubscribed row(s) not predicted: time sharing, not scaling")
        print(f"# largest error {100 * worst:.1f}% (target: within 15%); CSV {val_csv}")

    profiles = []
    # bench_scaling's MLP: its 1-rank weak row with the fewest micro-steps.
    ones = sorted((r for r in rows if r["mode"] == "weak" and r["ranks"] == 1),
                  key=lambda r: r["accum"])
    if ones:
        p = profile_of(ones[0])
        p.name = f"mlp-micro{ones[0]['micro']}"
        profiles.append(p)
    for spec in a.profile:
        parts = spec.split(":")
        if len(parts) not in (3, 4):
            sys.exit(f"scaling_model: --profile {spec}: write name:compute_s:grad_bytes[:update_s]")
        profiles.append(Profile(parts[0], float(parts[1]), int(float(parts[2])),
                                float(parts[3]) if len(parts) == 4 else 0.0, "given"))
    if a.measure_configs:
        profiles += measure_configs(a.memtrain, os.path.join(a.out, "configs"))
    if not profiles:
        sys.exit("scaling_model: no model profile: give --scaling-csv, --profile or --measure-configs")

    net = v100_cluster()
    print(f"# cluster: {net.source}; busbw intra {net.busbw_intra / 1e9:.0f} GB/s, inter "
          f"{net.busbw_inter / 1e9:.0f} GB/s, alpha_step {net.alpha_step * 1e6:.0f} us")
    out_csv = os.path.join(a.out, "scaling_model.csv")
    with open(out_csv, "w") as f:
        f.write("model,compute_per_micro_s,grad_bytes,update_s,gpus,accum,overlap,window_s,efficiency\n")
        for p in profiles:
            print(f"# {p.name}: c = {p.c * 1e3:.3f} ms per micro-step, gradient "
                  f"{p.grad_bytes / MiB:.2f} MiB, u = {p.u * 1e3:.3f} ms ({p.source})")
            print("%8s" % "gpus" + "".join(" %9s" % f"K{k}{'' if o else '-noov'}"
                                           for k in a.accum for o in (True, False)))
            for n in a.gpus:
                line = "%8d" % n
                for k in a.accum:
                    for o in (True, False):
                        w = window(p, net, n, k, o)
                        eff = (k * p.c + p.u) / w
                        line += " %9.3f" % eff
                        f.write(f"{p.name},{p.c},{p.grad_bytes},{p.u},{n},{k},{int(o)},{w},{eff}\n")
                print(line)
    print(f"# efficiency per cell; CSV {out_csv}")
    plot(out_csv, os.path.join(a.out, "scaling_model.png"), [p.name for p in profiles], a.accum)


def plot(path, png, names, accum):
    lines = []
    for name in names:
        for k in accum:
            lines.append(f"'{path}' every ::1 using (strcol(1) eq '{name}' && $6 == {k} && "
                         f"$7 == 1 ? $5 : NaN):9 with linespoints title '{name} K={k}'")
    gnuplot_png.draw(png, (
              "set logscale x 2\nset key bottom left\n"
              "set xlabel 'GPUs (V100 model)'\nset ylabel 'predicted efficiency'\n"
              "set yrange [0:1.05]\nset title 'memtrain scaling model (overlap on)'\n"
              "plot " + ", ".join(lines) + "\n"), size="1000,600")


if __name__ == "__main__":
    main()
