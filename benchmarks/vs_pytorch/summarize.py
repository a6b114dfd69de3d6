"""Summarises a benchmarks/vs_pytorch/run.sh output folder: prints the table
(machine and versions in its header), writes vs_pytorch.csv and draws
vs_pytorch.png with gnuplot. Standard library + numpy only.

Time per window: memtrain's `window_s` from rank 0's metrics.jsonl (the
micro-steps with their reads, the gradient all-reduce and the optimizer
step); PyTorch's from time.perf_counter() on rank 0 around the same three
(pytorch_ddp.py). The first --warmup windows of every run are left out;
median, interquartile range and min-max are over the remaining windows of
all repeats pooled. Peak RSS: the largest ru_maxrss of a rank's process,
both sides measured by the kernel the same way (the PyTorch side includes
the Python interpreter). memtrain's mem_peak is its accounting allocator's
peak of device-domain bytes (tensors only); on CUDA the PyTorch side's is
torch.cuda.max_memory_allocated (the same allocator statistic).

Where the window goes (second table): memtrain's t_compute_s,
t_comm_exposed_s and t_optimizer_s medians (metrics.jsonl), and PyTorch's
compute floor (pytorch_ddp.py --compute-floor: the same windows' forward
and backward alone, every rank at once, no all-reduce and no step). The
floor over PyTorch's window is the lowest ratio a trainer running the same
kernels can reach on this machine unless it computes faster than PyTorch
does: the ratio of a window that is compute alone."""

import argparse
import csv
import datetime
import glob
import json
import os
import platform
import shutil
import struct
import subprocess
import sys

import numpy as np


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ""


def machine(a, torch_version):
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(l for l in open("/proc/meminfo") if l.startswith("MemTotal")).split()[1]
        mem = f"{int(mem) / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        mem = "?"
    osname = ""
    if os.path.exists("/etc/os-release"):
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip().strip('"')
    env = {}
    envs = sorted(glob.glob(os.path.join(a.out, "runs", "*", "r1", "memtrain", "environment.json")))
    if envs:
        env = json.load(open(envs[0]))
    lib = env.get("libraries", {})
    rev = sh(f"git -C {os.path.dirname(os.path.abspath(__file__))} rev-parse --short HEAD")
    dirty = sh(f"git -C {os.path.dirname(os.path.abspath(__file__))} status --porcelain -uno")
    blas = os.path.realpath("/etc/alternatives/libblas.so.3-x86_64-linux-gnu") if os.path.exists(
        "/etc/alternatives/libblas.so.3-x86_64-linux-gnu") else "?"
    import h5py  # noqa: the Python side's h5py

    lines = [
        f"memtrain vs PyTorch DDP, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"machine: {platform.node()}, {cpu}, {os.cpu_count()} cores, {mem}, {osname}",
        f"memtrain {env.get('memtrain', '?')} (git {rev}{'+dirty' if dirty else ''}, {a.memtrain}), "
        f"LibTorch {lib.get('libtorch', '?')}, {lib.get('mpi', '?')}, HDF5 {lib.get('hdf5', '?')}",
        f"PyTorch {torch_version} (Python {platform.python_version()}, h5py {h5py.__version__}, numpy {np.__version__}), "
        f"BLAS {blas}",
        f"device {a.device}, {a.np} ranks, {env.get('ranks', [{}])[0].get('threads', '?')} intra-op thread(s) per rank both sides, "
        f"fp32, size {a.size}, {a.windows} windows x {a.repeats} repeats (alternating), first {a.warmup} window(s) of each run not timed",
    ]
    if a.device == "cuda":
        lines.append("GPU: " + (sh("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader") or "?"))
    return lines


def stats(v):
    v = sorted(v)
    q = np.percentile(v, [25, 50, 75])
    return {"median": float(q[1]), "p25": float(q[0]), "p75": float(q[2]), "min": v[0], "max": v[-1]}


def load_st(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for k, e in header.items():
        b, end = e["data_offsets"]
        dtype = {"F32": "<f4", "F64": "<f8", "I64": "<i8"}[e["dtype"]]  # I64: num_batches_tracked
        out[k] = np.frombuffer(blob[8 + n + b : 8 + n + end], dtype=dtype).reshape(e["shape"])
    return out


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def plan_of(a, case):
    """memtrain's memory plan of a MODEL+budget case (run.sh --budget), from
    its first repeat's memory_plan.json: its budget, checkpointed segments
    and the model's form; "-" without a budget."""
    if not case.endswith("+budget"):
        return "-"
    p = json.load(open(os.path.join(a.out, "runs", case, "r1", "memtrain", "memory_plan.json")))
    segs = len(p["checkpointed_segments"])  # their names
    tier = "none" if not segs else f"{segs} segs" + (" sel" if p["selective_recompute"] else "") + (
        " offload" if p["offload"] else "")
    form = p.get("model_form") or "one form"
    return f"{p['budget_bytes'] / 2**30:.1f} GiB: {tier}, {form}"


def model_row(a, m):
    side = {"memtrain": {"t": [], "loss": [], "rss": [], "peak": []}, "pytorch": {"t": [], "loss": [], "rss": [], "peak": []}}
    phases = {"compute": [], "comm_exposed": [], "optimizer": []}  # memtrain's
    floor = []  # PyTorch's compute alone, when measured
    batch, weights_diff, torch_version = None, 0.0, "?"
    for r in range(1, a.repeats + 1):
        run = os.path.join(a.out, "runs", m, f"r{r}")
        recs = [json.loads(l) for l in open(os.path.join(run, "memtrain", "metrics.jsonl"))]
        recs = [x for x in recs if x.get("type") == "window"]
        if len(recs) != a.windows:
            sys.exit(f"summarize.py: {run}/memtrain/metrics.jsonl has {len(recs)} window records, expected {a.windows}")
        batch = recs[0]["effective_batch"]
        mt = side["memtrain"]
        mt["t"] += [x["window_s"] for x in recs[a.warmup :]]
        for k in phases:
            phases[k] += [x[f"t_{k}_s"] for x in recs[a.warmup :]]
        mt["loss"].append([x["loss"] for x in recs])
        mt["peak"].append(max(x["mem_peak"] for x in recs))
        mt["rss"].append(max(int(open(f).read()) for f in glob.glob(os.path.join(run, "memtrain", "rss", "rank-*"))))
        p = json.load(open(os.path.join(run, "pytorch", "result.json")))
        torch_version = p["torch"]
        if p["effective_batch"] != batch:
            sys.exit(f"summarize.py: {run}: effective batch {batch} (memtrain) vs {p['effective_batch']} (PyTorch)")
        pt = side["pytorch"]
        pt["t"] += p["window_s"][a.warmup :]
        floor += p.get("compute_floor_s", [])[a.warmup :]
        pt["loss"].append(p["loss"])
        pt["peak"].append(p["peak_allocated_bytes"])
        pt["rss"].append(p["peak_rss_bytes"])
        wm = load_st(os.path.join(run, "memtrain", "model.safetensors"))
        wp = load_st(os.path.join(run, "pytorch", "model.safetensors"))
        # The parameters (PyTorch's file holds no buffers).
        weights_diff = max(weights_diff, max(float(np.max(np.abs(wm[k] - wp[k]))) for k in wp))
    row = {"model": m, "size": a.size, "device": a.device, "ranks": a.np, "effective_batch": batch,
           "windows": a.windows, "warmup": a.warmup, "repeats": a.repeats, "memtrain_plan": plan_of(a, m)}
    for s in ("memtrain", "pytorch"):
        st = stats(side[s]["t"])
        for k, v in st.items():
            row[f"{s}_window_s_{k}"] = v
        row[f"{s}_samples_per_s"] = batch / st["median"]
        row[f"{s}_peak_rss_bytes"] = max(side[s]["rss"])
        row[f"{s}_loss_last"] = side[s]["loss"][0][-1]
        row[f"{s}_loss_spread_over_repeats"] = max(l[-1] for l in side[s]["loss"]) - min(l[-1] for l in side[s]["loss"])
    row["memtrain_mem_peak_bytes"] = max(side["memtrain"]["peak"])
    row["pytorch_cuda_peak_allocated_bytes"] = max(side["pytorch"]["peak"]) if a.device == "cuda" else ""
    for k, v in phases.items():
        row[f"memtrain_{k}_s_median"] = stats(v)["median"]
    if floor:
        for k, v in stats(floor).items():
            row[f"pytorch_compute_floor_s_{k}"] = v
        row["floor_ratio"] = row["pytorch_compute_floor_s_median"] / row["pytorch_window_s_median"]
    row["ratio"] = row["memtrain_window_s_median"] / row["pytorch_window_s_median"]
    row["loss_rel_diff"] = rel(row["memtrain_loss_last"], row["pytorch_loss_last"])
    row["loss_rel_diff_max_any_window"] = max(
        rel(x, y) for lm, lp in zip(side["memtrain"]["loss"], side["pytorch"]["loss"]) for x, y in zip(lm, lp))
    row["weights_max_abs_diff"] = weights_diff
    return row, torch_version


def mib(b):
    return f"{b / 2**20:.0f}" if b != "" else "-"


def plot(a, rows):
    gp = shutil.which("gnuplot")
    png = os.path.join(a.out, "vs_pytorch.png")
    if not gp:
        print("summarize.py: gnuplot not found (apt-get install gnuplot-nox): no PNG", file=sys.stderr)
        return None
    dat = os.path.join(a.out, "vs_pytorch.dat")
    with open(dat, "w") as f:
        f.write("# model memtrain_ms(median p25 p75) pytorch_ms(median p25 p75) ratio\n")
        for r in rows:
            f.write(
                f"{r['model']} " + " ".join(f"{1e3 * r[f'{s}_window_s_{k}']:.4f}" for s in ("memtrain", "pytorch")
                                            for k in ("median", "p25", "p75")) + f" {r['ratio']:.4f}\n")
    script = f"""
set terminal pngcairo size 1000,420 font ",10"
set output '{png}'
set multiplot layout 1,2 title "memtrain vs PyTorch DDP ({a.device}, {a.np} ranks, size {a.size}, {a.windows} windows x {a.repeats} repeats)"
set style data histogram
set style histogram errorbars gap 2 lw 1
set style fill solid 0.6 border -1
set ylabel "time per window (ms), median, bars: IQR"
set logscale y
set key top left
set grid ytics
plot '{dat}' using 2:3:4:xtic(1) title 'memtrain', '' using 5:6:7 title 'PyTorch DDP'
unset logscale y
set style histogram clustered gap 2
set ylabel "memtrain / PyTorch (median time per window)"
set yrange [0:{max(1.25, 1.15 * max(r['ratio'] for r in rows)):.2f}]
set key top right
plot '{dat}' using 8:xtic(1) title 'ratio' lc rgb '#4060a0', 1.0 title '1.0' lc rgb 'red' lw 2 with lines
unset multiplot
"""
    gpf = os.path.join(a.out, "vs_pytorch.gp")
    open(gpf, "w").write(script)
    r = subprocess.run([gp, gpf], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"summarize.py: gnuplot failed: {r.stderr.strip()}", file=sys.stderr)
        return None
    return png


def print_table(table):
    """Rows of strings, the first the header, right-aligned in columns."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for k, row in enumerate(table):
        print("  ".join(c.rjust(widths[i]) for i, c in enumerate(row)))
        if k == 0:
            print("  ".join("-" * wd for wd in widths))


def main():
    ap = argparse.ArgumentParser()
    for k in ("out", "models", "device", "size", "memtrain", "mpiexec"):
        ap.add_argument("--" + k, required=True)
    for k in ("repeats", "windows", "warmup", "np"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--check-loss", type=float, default=None)
    a = ap.parse_args()
    rows, tv = [], "?"
    for m in a.models.split(","):
        row, tv = model_row(a, m)
        rows.append(row)
    head = machine(a, tv)
    cols = list(rows[0].keys())
    with open(os.path.join(a.out, "vs_pytorch.csv"), "w", newline="") as f:
        f.write("".join(f"# {h}\n" for h in head))
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    print("\n".join(head))
    hdr = ("model", "memtrain plan", "batch", "memtrain ms/window", "PyTorch ms/window", "ratio", "memtrain smp/s", "PyTorch smp/s",
           "RSS MiB m/p", "mem_peak MiB", f"loss@{a.windows} memtrain", f"loss@{a.windows} PyTorch", "rel diff", "max |dw|")
    table = [hdr]
    for r in rows:
        t = lambda s: (f"{1e3 * r[f'{s}_window_s_median']:.1f} [{1e3 * r[f'{s}_window_s_p25']:.1f}-"
                       f"{1e3 * r[f'{s}_window_s_p75']:.1f}]")
        table.append((r["model"], r["memtrain_plan"], str(r["effective_batch"]), t("memtrain"), t("pytorch"), f"{r['ratio']:.3f}",
                      f"{r['memtrain_samples_per_s']:.0f}", f"{r['pytorch_samples_per_s']:.0f}",
                      f"{mib(r['memtrain_peak_rss_bytes'])}/{mib(r['pytorch_peak_rss_bytes'])}",
                      mib(r["memtrain_mem_peak_bytes"]) + (f"/{mib(r['pytorch_cuda_peak_allocated_bytes'])}" if a.device == "cuda" else ""),
                      f"{r['memtrain_loss_last']:.7g}", f"{r['pytorch_loss_last']:.7g}", f"{r['loss_rel_diff']:.1e}",
                      f"{r['weights_max_abs_diff']:.1e}"))
    print_table(table)
    print("ms/window: median [interquartile range] over the timed windows of all repeats; "
          "RSS: peak resident set of a rank's process (max over ranks); mem_peak: memtrain's device-domain tensor peak"
          + (" / torch.cuda.max_memory_allocated" if a.device == "cuda" else ""))
    print()
    hdr = ("model", "memtrain compute", "comm exposed", "optimizer", "PyTorch compute floor", "floor / PyTorch window",
           "memtrain / PyTorch")
    table = [hdr]
    for r in rows:
        has = "floor_ratio" in r
        table.append((r["model"], f"{1e3 * r['memtrain_compute_s_median']:.1f}",
                      f"{1e3 * r['memtrain_comm_exposed_s_median']:.1f}", f"{1e3 * r['memtrain_optimizer_s_median']:.1f}",
                      (f"{1e3 * r['pytorch_compute_floor_s_median']:.1f} [{1e3 * r['pytorch_compute_floor_s_p25']:.1f}-"
                       f"{1e3 * r['pytorch_compute_floor_s_p75']:.1f}]") if has else "-",
                      f"{r['floor_ratio']:.3f}" if has else "-", f"{r['ratio']:.3f}"))
    print_table(table)
    print("where the window goes, ms, medians: memtrain's phases (metrics.jsonl); PyTorch's compute floor: the same "
          "windows' forward and backward alone, every rank at once (run.sh --compute-floor); floor / PyTorch window: the "
          "ratio of a trainer whose window is PyTorch's compute alone, with nothing exposed")
    png = plot(a, rows)
    print(f"wrote {os.path.join(a.out, 'vs_pytorch.csv')}" + (f", {png}" if png else ""))
    if a.check_loss is not None:
        bad = [r["model"] for r in rows if not r["loss_rel_diff"] <= a.check_loss]
        if bad:
            print(f"FAIL: loss after {a.windows} windows differs by more than {a.check_loss} relative: {', '.join(bad)}",
                  file=sys.stderr)
            sys.exit(1)
        print(f"losses after {a.windows} windows agree within {a.check_loss} relative on every model")


if __name__ == "__main__":
    main()
