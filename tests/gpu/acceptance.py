"""Reads what the acceptance runs of tests/gpu/run.sh wrote (Python standard
library only). Each command prints one line of `key=value` pairs that run.sh
puts into gpu-report.md, and exits 1 when the check it names fails.

  reldiff A.safetensors B.safetensors LIMIT   weights: max over tensors of
        max|a-b| / max|b| (relative), and max|a-b|; fails above LIMIT
  absdiff A B LIMIT                           max|a-b|; fails above LIMIT
  windows DIR                                 a run's windows: count, loss
        first/last, micro-batch, steps, largest mem_peak_reserved, OOM retries,
        loss_scale and skipped_steps when present
  peak DIR [KEY]                              largest KEY of its windows
        (default mem_peak_reserved; mem_peak: allocated bytes)
  outside DIR                                 memory_plan.json's
        outside_allocator_bytes (what the process held outside the caching
        allocator at start-up; 0 without a budget)
  plan DIR                                    memory_plan.json: budget, micro,
        steps, checkpointed segments, predicted/measured peak, probes
  env DIR                                     environment.json versions
  hosts DIR                                   environment.json: the node
        count and each rank's host, node index and device
"""

import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "peers"))
import safetensors_read  # noqa: E402


def windows(d):
    return [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"window"' in l]


def cmd_reldiff(a, b, limit):
    ta, _ = safetensors_read.load(a)
    tb, _ = safetensors_read.load(b)
    if ta.keys() != tb.keys():
        print(f"tensors differ: {sorted(ta)} vs {sorted(tb)}")
        return 1
    rel = absmax = 0.0
    for k in ta:
        x, y = ta[k][2], tb[k][2]
        d = max((abs(p - q) for p, q in zip(x, y)), default=0.0)
        scale = max((abs(q) for q in y), default=0.0)
        absmax = max(absmax, d)
        rel = max(rel, d / scale if scale > 0 else d)
    ok = rel <= float(limit)
    print(f"max_rel={rel:.3e} max_abs={absmax:.3e} limit={float(limit):.0e} tensors={len(ta)}")
    return 0 if ok else 1


def cmd_absdiff(a, b, limit):
    ta, _ = safetensors_read.load(a)
    tb, _ = safetensors_read.load(b)
    d = safetensors_read.max_abs_diff(ta, tb)
    print(f"max_abs={d:.3e} limit={float(limit):.0e}")
    return 0 if d <= float(limit) else 1


def cmd_windows(d):
    w = windows(d)
    if not w:
        print("windows=0")
        return 1
    losses = [x["loss"] for x in w]
    out = {
        "windows": len(w),
        "loss_first": f"{losses[0]:.5g}",
        "loss_last": f"{losses[-1]:.5g}",
        "finite": all(math.isfinite(l) for l in losses),
        "micro_batch": w[0].get("micro_batch"),
        "accum_steps": w[0].get("accum_steps"),
        "effective_batch": w[0].get("effective_batch"),
        "mem_peak": max(x.get("mem_peak", 0) for x in w),
        "mem_peak_reserved": max(x.get("mem_peak_reserved", 0) for x in w),
        "oom_retries": sum(x.get("oom_retries", 0) for x in w),
        "window_s_mean": f"{sum(x['window_s'] for x in w) / len(w):.4g}",
    }
    if any("loss_scale" in x for x in w):
        out["loss_scale_last"] = w[-1].get("loss_scale")
        out["loss_scale_min"] = min(x.get("loss_scale", math.inf) for x in w)
        out["skipped_steps"] = max(x.get("skipped_steps", 0) for x in w)
    print(" ".join(f"{k}={v}" for k, v in out.items()))
    return 0 if out["finite"] else 1


def cmd_peak(d, key="mem_peak_reserved"):
    print(max(x.get(key, 0) for x in windows(d)))
    return 0


def cmd_outside(d):
    p = json.load(open(os.path.join(d, "memory_plan.json")))
    print(int(p.get("outside_allocator_bytes", 0)))
    return 0


def cmd_plan(d):
    p = json.load(open(os.path.join(d, "memory_plan.json")))
    keys = ("budget_bytes", "micro_batch", "accumulation_steps", "checkpointed_segments",
            "predicted_peak_bytes", "measured_peak_bytes")
    line = " ".join(f"{k}={p.get(k)}" for k in keys)
    probes = p.get("probes", [])
    if probes:
        line += " probes=" + ",".join(
            f"{q.get('micro_batch')}x{q.get('segments', q.get('checkpointed_segments'))}:"
            f"{'fits' if q.get('fits') else 'OOM'}:{q.get('peak_bytes', q.get('peak'))}"
            for q in probes)
    print(line)
    return 0


def cmd_env(d):
    e = json.load(open(os.path.join(d, "environment.json")))
    flat = {k: v for k, v in e.items() if isinstance(v, (str, int, float))}
    for k, v in e.items():
        if isinstance(v, dict):
            flat.update({f"{k}.{a}": b for a, b in v.items() if isinstance(b, (str, int, float))})
    print(" ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in sorted(flat.items())))
    return 0


def cmd_hosts(d):
    e = json.load(open(os.path.join(d, "environment.json")))
    ranks = e["ranks"]
    each = ";".join(f"{r['host']}:{r['node_index']}:{r['device']}" for r in ranks)
    print(f"nodes={e['nodes']['count']} ranks={each}")
    return 0


if __name__ == "__main__":
    fn = globals().get("cmd_" + (sys.argv[1] if len(sys.argv) > 1 else ""))
    if fn is None:
        sys.exit(__doc__)
    sys.exit(fn(*sys.argv[2:]))
