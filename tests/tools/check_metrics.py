"""Checks a memtrain run's output folder: metrics.jsonl fields, a falling
loss, validation records, and model.safetensors readable by an independent
reader. Usage: check_metrics.py OUTDIR EPOCHS [--min-val-acc X]."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "peers"))
import safetensors_read  # noqa: E402

WINDOW_KEYS = ["epoch", "window", "loss", "lr", "micro_batch", "accum_steps",
               "effective_batch", "samples_per_s", "allreduce_calls",
               "allreduce_bytes", "t_compute_s", "t_comm_exposed_s",
               "t_optimizer_s", "host_syncs",
               "t_data_s", "mem_peak", "mem_peak_rank", "mem_reserved",
               "mem_reserved_rank", "oom_retries", "oom_retries_rank",
               "oom_retries_total"]


def records(outdir):
    with open(os.path.join(outdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return ([r for r in rows if r["type"] == "window"],
            [r for r in rows if r["type"] == "epoch"])


def same_losses(a, b, windows, tol):
    """The window losses of runs A and B: the same steps (WINDOWS of them),
    losses within TOL relative; returns the largest difference."""
    la = [(w["step"], w["loss"]) for w in records(a)[0]]
    lb = [(w["step"], w["loss"]) for w in records(b)[0]]
    assert [s for s, _ in la] == [s for s, _ in lb] and len(la) == windows, \
        (len(la), len(lb))
    worst = max(abs(x - y) / abs(x) for (_, x), (_, y) in zip(la, lb))
    assert worst <= tol, f"window losses differ by {worst:.3g} relative (bound {tol})"
    return worst


def main():
    outdir, epochs = sys.argv[1], int(sys.argv[2])
    min_acc = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    windows, epoch_rows = records(outdir)
    assert windows, "no window records"
    for w in windows:
        missing = [k for k in WINDOW_KEYS if k not in w]
        assert not missing, f"window record lacks {missing}: {w}"
        # Note [One host read per window]: the totals' read and the
        # window's end, whatever the accumulation steps.
        assert w["host_syncs"] == 2, f"host_syncs {w['host_syncs']}: {w}"
        # The same, as the dispatcher saw them (Note [Host reads seen by
        # the dispatcher]), wherever the run was watched.
        if os.environ.get("MEMTRAIN_WATCH_HOST_READS", "0") != "0":
            assert w.get("host_syncs_seen") == 2, f"host_syncs_seen {w.get('host_syncs_seen')}: {w}"
    assert len(epoch_rows) == epochs, f"{len(epoch_rows)} epoch records"
    for e in epoch_rows:
        assert "val_loss" in e and "val_accuracy" in e, e
    first = windows[0]["loss"]
    tail = [w["loss"] for w in windows[-10:]]
    last = sum(tail) / len(tail)
    assert last < 0.5 * first, f"loss did not fall: {first} -> {last}"
    acc = epoch_rows[-1]["val_accuracy"]
    assert acc >= min_acc, f"val accuracy {acc} < {min_acc}"
    tensors, meta = safetensors_read.load(os.path.join(outdir,
                                                       "model.safetensors"))
    assert all(dt == "F32" for dt, _, _ in tensors.values())
    assert meta.get("producer") == "memtrain", meta
    print(f"ok: {len(windows)} windows, loss {first:.4f} -> {last:.4f}, "
          f"val accuracy {acc:.4f}, tensors {sorted(tensors)}")


if __name__ == "__main__":
    main()
