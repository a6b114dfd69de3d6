#!/usr/bin/env python3
"""Recomputes per-volume validation from memtrain's prediction dumps.

usage: volume_dice.py VAL_H5 RUN_DIR [--tol 1e-9]

VAL_H5 is the validation file (rows that belong to volumes, docs/data-format.md:
/labels [N], /volume_ids [N], /voxel_index [N, 3]); RUN_DIR the output.dir
of a run with validation.dump_predictions: true. For every folder
RUN_DIR/val/epoch-EEE it reads each volume-<id>.h5 (/prediction [D, H, W]
int16, -1 where the volume has no row), looks up each row's predicted class
at its voxel, and recomputes, independently of memtrain's code:

  - per volume and class c: Dice = 2|P∩T| / (|P| + |T|) over the volume's
    rows; a class the volume's labels lack (T empty) does not count (MONAI
    DiceMetric's ignore_empty, memtrain's default);
  - a volume's Dice: the mean over its counted classes 1..K-1 (None when
    none counts);
  - val_dice_per_class[c]: the mean over the volumes that count c;
  - val_dice: the mean of the volumes' Dice (DiceMetric's reduction
    "mean");
  - val_accuracy over all rows.

Checks them against the validation record of epoch EEE - 1 in
RUN_DIR/metrics.jsonl (val_cases, val_dice, val_dice_per_class,
val_accuracy, val_volumes, val_samples), the folder's summary.json
(case_mean) and each file's `dice` and `volume_id` attributes, within
--tol; also that the grid
has the volume's extent, that every position without a row is -1 and every
position with one a class. Prints one line per epoch; exits 1 on any
mismatch. Needs h5py and numpy (Debian's python3-h5py, python3-numpy).
"""
import argparse
import glob
import json
import math
import os
import re
import sys

import h5py
import numpy as np


def close(a, b, tol):
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)) or (
            isinstance(b, float) and math.isnan(b)):
        none_a = a is None or (isinstance(a, float) and math.isnan(a))
        none_b = b is None or (isinstance(b, float) and math.isnan(b))
        return none_a and none_b
    return abs(a - b) <= tol


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("val_h5")
    ap.add_argument("run_dir")
    ap.add_argument("--tol", type=float, default=1e-9)
    args = ap.parse_args()

    with h5py.File(args.val_h5, "r") as f:
        labels = f["labels"][:].astype(np.int64)
        ids = f["volume_ids"][:].astype(np.int64)
        voxels = f["voxel_index"][:].astype(np.int64)
        file_classes = int(f.attrs.get("num_classes", labels.max() + 1))
    volumes = sorted(set(ids.tolist()))
    rows_of = {v: np.nonzero(ids == v)[0] for v in volumes}

    records = {}
    with open(os.path.join(args.run_dir, "metrics.jsonl")) as m:
        for line in m:
            j = json.loads(line)
            if j.get("type") == "validation":
                records[j["epoch"]] = j

    folders = sorted(glob.glob(os.path.join(args.run_dir, "val", "epoch-*")))
    if not folders:
        sys.exit(f"no {args.run_dir}/val/epoch-* folders")
    failures = []
    for folder in folders:
        epoch = int(re.search(r"epoch-(\d+)$", folder).group(1)) - 1
        rec = records.get(epoch)
        if rec is None:
            failures.append(f"{folder}: no validation record of epoch {epoch}")
            continue
        names = sorted(n for n in os.listdir(folder) if n != "summary.json")
        try:
            with open(os.path.join(folder, "summary.json")) as sj:
                summary = json.load(sj)
        except OSError as e:
            failures.append(f"{folder}: no summary.json ({e})")
            summary = {}
        want = sorted(f"volume-{v}.h5" for v in volumes)
        if names != want:
            failures.append(f"{folder}: files {names}, expected {want}")
            continue
        preds, attrs = {}, {}
        for v in volumes:
            with h5py.File(os.path.join(folder, f"volume-{v}.h5"), "r") as f:
                grid = f["prediction"][:]
                attrs[v] = (int(f.attrs["volume_id"]), float(f.attrs["dice"]))
            r = rows_of[v]
            extent = tuple(int(x) for x in voxels[r].max(axis=0) + 1)
            if grid.shape != extent or grid.dtype != np.int16:
                failures.append(
                    f"{folder}: volume {v}: grid {grid.shape} {grid.dtype}, "
                    f"expected {extent} int16")
                continue
            have = np.zeros(extent, dtype=bool)
            have[tuple(voxels[r].T)] = True
            if (grid[~have] != -1).any():
                failures.append(f"{folder}: volume {v}: a position without "
                                "a row is not -1")
            p = grid[tuple(voxels[r].T)].astype(np.int64)
            if (p < 0).any():
                failures.append(f"{folder}: volume {v}: a row's position "
                                "holds -1")
            preds[v] = p
        if len(preds) != len(volumes):
            continue
        k = max(file_classes, int(labels.max()) + 1,
                max(int(p.max()) + 1 for p in preds.values()))
        per_volume, per_class = {}, [[] for _ in range(k)]
        correct = 0
        for v in volumes:
            p, t = preds[v], labels[rows_of[v]]
            correct += int((p == t).sum())
            dice = []
            for c in range(k):
                inter = int(((p == c) & (t == c)).sum())
                both = int((p == c).sum()) + int((t == c).sum())
                dice.append(2 * inter / both if (t == c).any() else None)
                if dice[c] is not None:
                    per_class[c].append(dice[c])
            per_volume[v] = mean(dice[1:])
            vid, vdice = attrs[v]
            if vid != v or not close(vdice, per_volume[v], args.tol):
                failures.append(
                    f"{folder}: volume-{v}.h5 attributes volume_id={vid}, "
                    f"dice={vdice}; recomputed {per_volume[v]}")
        class_mean = [mean(d) for d in per_class]
        val_dice = mean(list(per_volume.values()))
        accuracy = correct / len(labels)
        got = {c["case"]: c["mean"] for c in rec.get("val_cases", [])}
        if sorted(got) != sorted(str(v) for v in volumes):
            failures.append(f"epoch {epoch + 1}: val_cases has volumes "
                            f"{sorted(got)}, the file {volumes}")
        worst = 0.0
        for v in volumes:
            a, b = got.get(str(v)), per_volume[v]
            if not close(a, b, args.tol):
                failures.append(f"epoch {epoch + 1}: volume {v}: metrics.jsonl "
                                f"{a}, recomputed {b}")
            elif a is not None:
                worst = max(worst, abs(a - b))
        rec_classes = rec.get("val_dice_per_class", [])
        for c in range(max(k, len(rec_classes))):
            a = rec_classes[c] if c < len(rec_classes) else None
            b = class_mean[c] if c < k else None
            if not close(a, b, args.tol):
                failures.append(f"epoch {epoch + 1}: val_dice_per_class[{c}] "
                                f"{a}, recomputed {b}")
        if summary and not close(summary["case_mean"]["Dice"], val_dice, args.tol):
            failures.append(f"{folder}/summary.json: case_mean "
                            f"{summary['case_mean']}, recomputed {val_dice}")
        for key, value in (("val_dice", val_dice),
                           ("val_accuracy", accuracy)):
            if not close(rec.get(key), value, args.tol):
                failures.append(f"epoch {epoch + 1}: {key} {rec.get(key)}, "
                                f"recomputed {value}")
        if rec.get("val_volumes") != len(volumes) or rec.get(
                "val_samples") != len(labels):
            failures.append(
                f"epoch {epoch + 1}: val_volumes {rec.get('val_volumes')}, "
                f"val_samples {rec.get('val_samples')}; the file has "
                f"{len(volumes)} volumes, {len(labels)} rows")
        print(f"epoch {epoch + 1}: {len(volumes)} volumes, val_dice "
              f"{val_dice} (per volume: " +
              ", ".join(f"{v}: {per_volume[v]:.6f}" if per_volume[v]
                        is not None else f"{v}: None" for v in volumes) +
              f"), val_accuracy {accuracy}; metrics.jsonl agrees "
              f"(largest per-volume difference {worst:.3g})")
    if failures:
        for f in failures:
            print("MISMATCH:", f, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
