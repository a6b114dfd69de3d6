#!/usr/bin/env python3
"""bench_scaling: memtrain's trainer itself at 1, 2, 4, ... ranks.

Weak scaling keeps the micro-batch per rank fixed (the effective batch grows
with the ranks); strong scaling keeps the effective batch fixed (the
micro-batch per rank shrinks). Each at accumulation steps K = 1, 4, 16. For
every run: the median window time after --warmup windows, samples/s,
efficiency against 1 rank (samples/s at N / (N x samples/s at 1)), and the
window split into compute, exposed communication and data wait, from the
trainer's own timers in metrics.jsonl (rank 0's). Prints a table, writes
OUT/bench_scaling.csv and draws OUT/bench_scaling.png (gnuplot).

  python3 benchmarks/bench_scaling.py [--memtrain build/memtrain]
      [--ranks 1,2,4] [--accum 1,4,16] [--modes weak,strong]
      [--micro 64] [--hidden 512] [--depth 4] [--features 256]
      [--windows 8] [--warmup 2] [--out runs/bench_scaling]
      [--launch 'mpirun -np {n}'] [--config FILE] [-- overrides...]

--launch is the command that starts {n} ranks: `srun --mpi=pmix -n {n}`
inside a SLURM allocation (launch/slurm/scaling.sbatch), mpirun with a
hostfile across hosts (benchmarks/multinode_scaling.sh). With the default
mpirun (no hostfile or host list), more ranks than this process's CPUs get
--oversubscribe, and the output says so: such points measure time sharing,
not scaling. Every row also gets cpu_load, from what the ranks report in
environment.json (their CPU masks and threads): the most threads one CPU
carries, each rank's threads spread over its mask's CPUs, summed over the
ranks of one machine (of one host; of all hosts with --one-machine, as for
emulated nodes); at least 1. Above 1, ranks time-share CPUs.
"""

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess

import gnuplot_png
import sys
import time


def ints(text):
    return [int(x) for x in text.split(",") if x]


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(cmd, log):
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        sys.stdout.write(open(log).read()[-3000:])
        sys.exit(f"bench_scaling: {' '.join(cmd)} failed (exit {rc}); log {log}")


def cpu_set(text):
    """A CPU list as environment.json writes it ("0-3,6") as a set."""
    cpus = set()
    for part in text.split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def cpu_load(env, one_machine):
    """The most threads one CPU carries (at least 1): each rank's threads
    spread evenly over its mask, summed per CPU over the ranks of one
    machine (a host, or every host with one_machine)."""
    load = {}
    for r in env["ranks"]:
        mask = cpu_set(r.get("cpus", ""))
        machine = "" if one_machine else r["host"]
        for cpu in mask:
            key = (machine, cpu)
            load[key] = load.get(key, 0.0) + r["threads"] / len(mask)
    return max([1.0] + list(load.values()))


def windows(path):
    return [json.loads(l) for l in open(path) if '"type":"window"' in l.replace(" ", "")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memtrain", default="build/memtrain")
    ap.add_argument("--ranks", type=ints, default=[1, 2, 4])
    ap.add_argument("--accum", type=ints, default=[1, 4, 16])
    ap.add_argument("--modes", default="weak,strong")
    ap.add_argument("--micro", type=int, default=64,
                    help="micro-batch per rank (weak); at 1 rank (strong)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="runs/bench_scaling")
    ap.add_argument("--launch", default="mpirun -np {n}")
    ap.add_argument("--config", default="")
    ap.add_argument("--one-machine", action="store_true",
                    help="the hosts share one machine's CPUs (emulated nodes)")
    ap.add_argument("overrides", nargs="*", help="--section.key=value ...")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in ("weak", "strong"):
            sys.exit(f"bench_scaling: --modes: unknown mode '{m}' (weak, strong)")
    if a.windows <= a.warmup:
        sys.exit("bench_scaling: --windows must exceed --warmup")
    if "strong" in modes:
        bad = [n for n in a.ranks if a.micro % n]
        if bad:
            sys.exit(f"bench_scaling: strong scaling splits --micro {a.micro} "
                     f"over {bad} ranks: choose a --micro divisible by each")
    if not os.access(a.memtrain, os.X_OK):
        sys.exit(f"bench_scaling: {a.memtrain} not built (bash launch/build.sh)")
    os.makedirs(a.out, exist_ok=True)
    cpus = len(os.sched_getaffinity(0))
    words = shlex.split(a.launch)
    # mpirun placing ranks on this host only: more ranks than CPUs need
    # --oversubscribe. A launch naming its hosts places them itself.
    hosts = ("--hostfile", "-hostfile", "--machinefile", "-machinefile", "--host", "-host", "-H")
    mpirun = (os.path.basename(words[0]) in ("mpirun", "mpiexec")
              and not any(w.split("=")[0] in hosts for w in words))

    # One training file large enough for the largest window.
    data = os.path.join(a.out, "train.h5")
    biggest = max(a.ranks) * a.micro * max(a.accum) * a.windows
    run([a.memtrain, "make-data", "--kind", "features", "--out", data,
         "--samples", str(biggest), "--features", str(a.features)],
        os.path.join(a.out, "make-data.log"))

    # Strong scaling's smaller micro-batches also run on 1 rank
    # ("calibration" rows): the compute per micro-step scaling_model.py
    # predicts the multi-rank points from.
    plan = [(m, k, n, a.micro if m == "weak" else a.micro // n)
            for m in modes for k in a.accum for n in a.ranks]
    if "strong" in modes:
        plan += [("calibration", k, 1, a.micro // n)
                 for k in a.accum for n in a.ranks if n > 1]
    rows = []
    for mode, k, n, micro in plan:
        tag = f"{mode}-k{k}-n{n}" + (f"-m{micro}" if mode == "calibration" else "")
        cmd = shlex.split(a.launch.replace("{n}", str(n)))
        over = mpirun and n > cpus
        if over:
            cmd.append("--oversubscribe")
        cmd += [a.memtrain, "train"]
        if a.config:
            cmd += ["--config", a.config]
        cmd += [f"--data.train={data}", "--data.val=",
                f"--data.batch_size={micro}",
                f"--training.gradient_accumulation_steps={k}",
                f"--training.max_windows={a.windows}",
                "--training.epochs=1000",
                "--model.name=mlp", f"--model.hidden={a.hidden}",
                f"--model.depth={a.depth}",
                f"--output.dir={os.path.join(a.out, tag)}",
                "--output.overwrite=true",  # its own folders, rerun
                "--output.progress=lines"] + a.overrides
        t0 = time.time()
        run(cmd, os.path.join(a.out, tag + ".log"))
        w = windows(os.path.join(a.out, tag, "metrics.jsonl"))[a.warmup:]
        env = json.load(open(os.path.join(a.out, tag, "environment.json")))
        if not w:
            sys.exit(f"bench_scaling: {tag}: no windows after the warm-up")
        med = lambda key: statistics.median(x[key] for x in w)
        window_s = med("window_s")
        rows.append(dict(
            mode=mode, accum=k, ranks=n, micro=micro,
            effective_batch=w[0]["effective_batch"],
            oversubscribed=int(over), cpu_load=cpu_load(env, a.one_machine),
            hosts=len({r["host"] for r in env["ranks"]}), window_s=window_s,
            window_min_s=min(x["window_s"] for x in w),
            window_max_s=max(x["window_s"] for x in w),
            samples_per_s=w[0]["effective_batch"] / window_s,
            t_compute_s=med("t_compute_s"),
            t_comm_exposed_s=med("t_comm_exposed_s"),
            t_data_s=med("t_data_s"),
            grad_bytes=w[0]["allreduce_bytes"],
            compute_per_micro_s=med("t_compute_s") / k,
            buckets_early=med("buckets_early"),
            run_s=time.time() - t0))

    for r in rows:
        base = [b for b in rows if b["mode"] == r["mode"] and b["accum"] == r["accum"]
                and b["ranks"] == min(a.ranks)][0] if r["mode"] != "calibration" else r
        r["efficiency"] = (r["samples_per_s"] * base["ranks"]
                           / (r["ranks"] * base["samples_per_s"]))

    env = json.load(open(os.path.join(a.out, rows[0]["mode"] + f"-k{a.accum[0]}-n{a.ranks[0]}",
                                      "environment.json")))
    r0 = env["ranks"][0]
    print(f"# bench_scaling: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
          f"{platform.node()}, {cpu_model()}, {os.cpu_count()} CPUs online "
          f"({cpus} in this process's mask)")
    print(f"# LibTorch {env['libraries']['libtorch']}, {env['libraries']['mpi']}, "
          f"BLAS {r0.get('blas', '?')}; threads per rank at {env['world_size']} "
          f"rank(s): {r0['threads']} ({r0.get('threads_from', '?')})")
    print(f"# MLP hidden {a.hidden} depth {a.depth}, {a.features} features; "
          f"{a.windows} windows, medians of the last {a.windows - a.warmup}; "
          f"launch: {a.launch}")
    if any(r["oversubscribed"] for r in rows):
        print(f"# --oversubscribe: rows marked * ran more ranks than the {cpus} "
              "CPU(s) here: time sharing, not scaling")
    if any(r["cpu_load"] > 1 for r in rows):
        print("# cpu_load above 1: that many threads on the busiest CPU (the ranks' "
              "masks and threads, environment.json): time sharing")
    hdr = ("mode", "K", "ranks", "hosts", "cpu_load", "micro", "eff_batch", "window_s",
           "samples/s", "efficiency", "compute_s", "exposed_s", "data_s")
    print("%-6s %3s %6s %5s %9s %6s %9s %9s %10s %10s %10s %10s %8s" % hdr)
    for r in rows:
        print("%-6s %3d %5d%s %5d %9.2f %6d %9d %9.4f %10.1f %10.3f %10.4f %10.4f %8.4f" % (
            r["mode"], r["accum"], r["ranks"], "*" if r["oversubscribed"] else " ",
            r["hosts"], r["cpu_load"], r["micro"], r["effective_batch"], r["window_s"],
            r["samples_per_s"], r["efficiency"], r["t_compute_s"], r["t_comm_exposed_s"],
            r["t_data_s"]))
    csv = os.path.join(a.out, "bench_scaling.csv")
    keys = list(rows[0].keys())
    with open(csv, "w") as f:
        f.write(",".join(keys) + "\n")
        for r in rows:
            f.write(",".join(str(r[k]) for k in keys) + "\n")
    print(f"# CSV {csv}")
    plot(csv, os.path.join(a.out, "bench_scaling.png"), keys, modes, a.accum)


def plot(csv, png, keys, modes, accum):
    col = {k: i + 1 for i, k in enumerate(keys)}
    lines = []
    for m in modes:
        for k in accum:
            lines.append(
                f"'{csv}' every ::1 using (strcol({col['mode']}) eq '{m}' && "
                f"${col['accum']} == {k} ? ${col['ranks']} : NaN):{col['efficiency']} "
                f"with linespoints title '{m} K={k}'")
    gnuplot_png.draw(png, "set key bottom left\nset xlabel 'ranks'\n"
                     "set ylabel 'efficiency vs 1 rank'\nset yrange [0:*]\n"
                     "set title 'memtrain scaling (MLP)'\n"
                     "plot " + ", ".join(lines) + "\n")


if __name__ == "__main__":
    main()
