"""Reads RUN_DIR/tb with TensorBoard's own Python package (an independent
reader: EventAccumulator, the loader `tensorboard --logdir` uses with
--load_fast=false, purging orphaned steps at a SessionLog START) and checks
it against RUN_DIR/metrics.jsonl: the tags, the steps (no step twice after
a resume) and the values (equal after rounding to float32).

usage: read_tb.py RUN_DIR CLASS_NAME... (the per-class Dice tags expected;
none for row data)"""

import glob
import json
import math
import os
import shutil
import struct
import sys
import tempfile

from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import event_file_loader

run, classes = sys.argv[1], sys.argv[2:]
MiB = 1024.0 * 1024.0


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


acc = ea.EventAccumulator(os.path.join(run, "tb"), size_guidance={ea.SCALARS: 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
recs = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]

# The step of each record: a window's own; validation and epoch records go at
# the step of the window before them.
expected = {}  # tag -> [(step, value)]
step = 0
for r in recs:
    t = r["type"]
    if t == "window":
        step = r["step"]
        vals = {"train/loss": r["loss"], "train/lr": r["lr"],
                "train/samples_per_s": r["samples_per_s"],
                "memory/peak_MiB": r["mem_peak"] / MiB,
                "memory/reserved_MiB": r["mem_reserved"] / MiB}
    elif t == "validation":
        vals = {"val/loss": r["val_loss"]}
        for k in ("val_dice", "val_accuracy", "val_accuracy_ci95"):
            if r.get(k) is not None:
                vals["val/" + k[4:]] = r[k]
        for name, d in zip(classes, r.get("val_dice_per_class", [])):
            if d is not None:
                vals["val/dice/" + name] = d
    elif t == "epoch":
        vals = {"epoch/train_loss": r["train_loss"]}
    else:
        continue
    for tag, v in vals.items():
        expected.setdefault(tag, []).append((step, v))

plan = json.load(open(os.path.join(run, "memory_plan.json")))
if plan["usable_bytes"] > 0:  # a budget: memory against it
    budget = plan["budget_bytes"]
    for r in recs:
        if r["type"] == "window":
            expected.setdefault("memory/budget_MiB", []).append((r["step"], budget / MiB))
            expected.setdefault("memory/peak_of_budget", []).append(
                (r["step"], r["mem_peak"] / budget))
optional = set()
assert set(expected) <= tags and tags - set(expected) <= optional, \
    f"tags: TensorBoard has {sorted(tags)}, metrics.jsonl gives {sorted(expected)}"
for name in classes:
    if not any(t == "val/dice/" + name for t in tags):
        print(f"note: no Dice for class {name!r} (absent from every volume)")
points = 0
for tag, want in expected.items():
    got = [(e.step, e.value) for e in acc.Scalars(tag)]
    assert [s for s, _ in got] == [s for s, _ in want], \
        f"{tag}: steps {[s for s, _ in got]} want {[s for s, _ in want]}"
    for (s, g), (_, w) in zip(got, want):
        assert g == f32(w) or (math.isnan(g) and math.isnan(w)), f"{tag} step {s}: {g} vs {w}"
    points += len(got)

# The loader `tensorboard` reads files with checks each record's CRCs: a
# flipped byte in a copy makes it stop there.
files = sorted(glob.glob(os.path.join(run, "tb", "events.out.tfevents.*")))
n = [sum(1 for _ in event_file_loader.EventFileLoader(f).Load()) for f in files]
with tempfile.TemporaryDirectory() as tmp:
    bad = os.path.join(tmp, os.path.basename(files[0]))
    shutil.copy(files[0], bad)
    data = bytearray(open(bad, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(bad, "wb").write(bytes(data))
    n_bad = sum(1 for _ in event_file_loader.EventFileLoader(bad).Load())
assert n_bad < n[0], f"a corrupted copy still gave all {n[0]} events: CRCs not checked"
print(f"read_tb: {len(files)} event file(s) with {n} events; {len(tags)} tags, "
      f"{points} points equal to metrics.jsonl; a corrupted copy stops after {n_bad} events")
