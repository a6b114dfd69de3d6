#!/usr/bin/env bash
# memtrain convert-images on an image folder written by PIL (python3-pil):
# JPEG (RGB, grayscale), PNG (RGB, gray, RGBA, palette), sizes that need a
# resize and a crop, a truncated JPEG, a zero-byte .png, a .txt file and a
# hidden file. Checks:
# - the summary, each skipped file named on stderr with its reason, exit 0;
# - h5py: /images uint8 [N, 3, 32, 32], one chunk per sample with
#   Fletcher32, /labels in class order, class_names in byte order, the
#   root attributes, per class round(0.25 n) validation images;
# - each row is the image the documented split rule (SplitMix64/FNV-1a,
#   recomputed here) puts there, within 2 grey levels (mean absolute
#   difference) of PIL's own decode + Resize(32, bilinear) + CenterCrop(32);
# - memtrain inspect: problems: none, inspect --verify: all verified;
# - model.name=cnn trains one window on the result with 2 ranks;
# - --classes with a split CSV (filename,label, CRLF) and a one-per-line
#   file: exactly the listed classes, in sorted order;
# - bad inputs exit 2 with one error line, outputs untouched, no temp file
#   (a listed class without a folder, a repeated class, no label column
#   named with the file and the line).
source "$(dirname "$0")/common.sh"
# PIL, h5py and numpy: $PY if it has them, else Debian's python3
# (python3-pil, python3-h5py: launch/install_deps.sh).
for c in "$PY" /usr/bin/python3 fail; do
  [ "$c" = fail ] && fail "no python3 with PIL, h5py and numpy (apt-get install python3-pil python3-h5py)"
  if "$c" -c 'import PIL, h5py, numpy' >/dev/null 2>&1; then PY=$c; break; fi
done

"$PY" - <<'PYEOF'
import os
import numpy as np
from PIL import Image
rng = np.random.default_rng(7)
def smooth(h, w, tint):
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([128 + 100 * np.sin(x / 7 + k) * np.cos(y / 9) for k in range(3)], -1)
    return np.clip(base * 0.5 + np.array(tint) * 0.5 + rng.normal(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)
tints = {"ant": (230, 40, 40), "Bee": (40, 230, 40), "cow": (40, 40, 230)}
for c, tint in tints.items():
    os.makedirs(f"imgs/{c}", exist_ok=True)
    for i in range(12):
        h, w = 40 + 3 * i, 70 - 2 * i  # portrait and landscape
        a = smooth(h, w, tint)
        kind = i % 5
        if kind == 0:
            Image.fromarray(a).save(f"imgs/{c}/{i:02d}.jpg", quality=92)
        elif kind == 1:
            Image.fromarray(a).convert("L").save(f"imgs/{c}/{i:02d}.JPEG", quality=92)
        elif kind == 2:
            Image.fromarray(a).convert("L").save(f"imgs/{c}/{i:02d}.png")
        elif kind == 3:
            rgba = np.dstack([a, rng.integers(0, 256, a.shape[:2], dtype=np.uint8)])
            Image.fromarray(rgba, "RGBA").save(f"imgs/{c}/{i:02d}.png")
        else:
            Image.fromarray(a).convert("P", palette=Image.ADAPTIVE).save(f"imgs/{c}/{i:02d}.png")
good = open("imgs/ant/00.jpg", "rb").read()
open("imgs/ant/broken.jpg", "wb").write(good[: len(good) // 2])
open("imgs/cow/empty.png", "wb").close()
open("imgs/cow/notes.txt", "w").write("not an image\n")
open("imgs/Bee/.DS_Store", "wb").write(b"\0" * 10)
PYEOF

mkdir -p data
"$MEMTRAIN" convert-images --folder imgs --out data/train.h5 --size 32 \
  --val-fraction 0.25 --seed 3 >log.txt 2>err.txt || { cat log.txt err.txt; fail "convert-images"; }
cat log.txt err.txt
grep -qxF "skipped: imgs/ant/broken.jpg: JPEG (libjpeg): Premature end of JPEG file" err.txt ||
  fail "the truncated JPEG is not named"
grep -qxF "skipped: imgs/cow/empty.png: empty file (0 bytes)" err.txt || fail "the empty file is not named"
[ "$(grep -c '^skipped: ' err.txt)" = 2 ] || fail "want 2 skipped lines"
grep -qF "images: 36 (train 27, val 9); skipped (unreadable): 2; decoded with warnings: 0; other files ignored: 1 (.txt); hidden entries: 1" log.txt ||
  fail "summary line"
grep -qxF "class 1 'ant': 12 images (9 train, 3 val), 1 skipped" log.txt || fail "class line"

PYTHONPATH=$PEER_SCRIPTS "$PY" - <<'PYEOF' || fail "contents"
import glob, os
import h5py, numpy as np
from PIL import Image
from split_rule import by_split_key
def ref(path, s=32):  # torchvision: Resize(s) (PIL bilinear) + CenterCrop(s)
    im = Image.open(path).convert("RGB")
    w, h = im.size
    nw, nh = (s, int(s * h / w)) if w <= h else (int(s * w / h), s)
    im = im.resize((nw, nh), Image.BILINEAR)
    l, t = int(round((nw - s) / 2.0)), int(round((nh - s) / 2.0))
    return np.asarray(im.crop((l, t, l + s, t + s))).transpose(2, 0, 1)
classes = sorted(d for d in os.listdir("imgs") if not d.startswith("."))
assert classes == ["Bee", "ant", "cow"], classes
want = {"train": ([], []), "val": ([], [])}
for c, name in enumerate(classes):
    files = sorted(f for f in os.listdir(f"imgs/{name}")
                   if f.lower().endswith((".jpg", ".jpeg", ".png")) and not f.startswith(".")
                   and f not in ("broken.jpg", "empty.png"))
    n_val = int(np.floor(0.25 * len(files) + 0.5))
    by_key = by_split_key(files, 3)
    val = set(by_key[:n_val])
    for f in files:
        split = "val" if f in val else "train"
        want[split][0].append(f"imgs/{name}/{f}")
        want[split][1].append(c)
worst = 0
for split, path in [("train", "data/train.h5"), ("val", "data/train-val.h5")]:
    with h5py.File(path, "r") as h:
        x, y = h["images"], h["labels"][:]
        assert x.dtype == np.uint8 and x.shape == (len(want[split][0]), 3, 32, 32), x.shape
        assert x.chunks == (1, 3, 32, 32) and x.fletcher32 and h["labels"].fletcher32
        assert list(y) == want[split][1], (split, list(y))
        a = h.attrs
        assert a["class_names"].decode() == "Bee,ant,cow" and a["num_classes"] == 3
        assert a["layout_version"] == 1 and a["kind"].decode() == "images"
        assert a["source"].decode() == "imgs" and a["split"].decode() == split
        assert a["num_images"] == len(y) and a["skipped_files"] == 2
        assert abs(x.attrs["scale"] - 1 / 255) < 1e-12 and x.attrs["shift"] == 0
        for i, f in enumerate(want[split][0]):
            mad = np.abs(x[i].astype(float) - ref(f)).mean()
            worst = max(worst, mad)
            assert mad < 2, (split, i, f, mad)
print(f"ok: rows = the split rule's files; worst mean |memtrain - PIL| = {worst:.3f} grey levels")
PYEOF

for f in data/train.h5 data/train-val.h5; do
  "$MEMTRAIN" inspect "$f" >inspect.txt 2>&1 || { cat inspect.txt; fail "inspect $f"; }
  grep -q "problems: none" inspect.txt || { cat inspect.txt; fail "inspect $f"; }
  "$MEMTRAIN" inspect --verify "$f" >verify.txt 2>&1 || { cat verify.txt; fail "verify $f"; }
  grep -q "chunks of 2 datasets verified" verify.txt || { cat verify.txt; fail "verify $f"; }
done
cat inspect.txt

mpi -np 2 "$MEMTRAIN" train --model.name=cnn --model.hidden=8 \
  --data.train=data/train.h5 --data.val=data/train-val.h5 --data.batch_size=4 \
  --training.epochs=1 --training.max_windows=1 --output.dir=out/cnn >train.txt 2>&1 ||
  { cat train.txt; fail "cnn training"; }
"$PY" - <<'PYEOF' || fail "metrics"
import json
rows = [json.loads(l) for l in open("out/cnn/metrics.jsonl")]
w = [r for r in rows if r["type"] == "window"]
assert len(w) == 1 and w[0]["loss"] > 0, w
print("ok: one cnn window, loss", w[0]["loss"])
PYEOF

# --val-fraction 0: the training file only.
"$MEMTRAIN" convert-images --folder imgs --out all/all.h5 --size 16 \
  --val-fraction 0 >/dev/null 2>&1 || fail "--val-fraction 0"
[ -f all/all.h5 ] && [ ! -e all/all-val.h5 ] || fail "--val-fraction 0 wrote a val file"

# --classes: miniImageNet-style split files select class folders, one file
# per split; labels follow the selected classes' sorted order.
printf 'filename,label\r\ncow0001.jpg,cow\r\nant0001.jpg,ant\r\ncow0002.jpg,cow\r\n' >split-train.csv
printf 'Bee\n\n' >split-test.txt
"$MEMTRAIN" convert-images --folder imgs --out split/train.h5 --size 16 --val-fraction 0 \
  --classes split-train.csv >split-train.log 2>&1 || { cat split-train.log; fail "--classes CSV"; }
grep -qxF "classes: 2 of 3 class folders, listed in --classes 'split-train.csv'" split-train.log ||
  { cat split-train.log; fail "--classes: the selection line"; }
"$MEMTRAIN" convert-images --folder imgs --out split/test.h5 --size 16 --val-fraction 0 \
  --classes split-test.txt >split-test.log 2>&1 || { cat split-test.log; fail "--classes list"; }
"$PY" - <<'PYEOF' || fail "--classes contents"
import h5py, numpy as np
for path, names, n in (("split/train.h5", "ant,cow", [12, 12]), ("split/test.h5", "Bee", [12])):
    with h5py.File(path, "r") as f:
        got = f.attrs["class_names"]
        got = got.decode() if isinstance(got, bytes) else got
        assert got == names, (path, got)
        assert f.attrs["num_classes"] == len(n), path
        assert np.bincount(f["labels"][...]).tolist() == n, (path, np.bincount(f["labels"][...]))
print("ok: --classes: split/train.h5 ant,cow (12 + 12), split/test.h5 Bee (12)")
PYEOF

# --- bad inputs: exit 2, one error line, nothing touched ---------------------
cp data/train.h5 keep.h5
expect_error() {  # PATTERN ARGS...
  local pattern=$1 rc=0
  shift
  "$MEMTRAIN" convert-images "$@" >out.txt 2>err.txt || rc=$?
  [ "$rc" = 2 ] || { cat out.txt err.txt; fail "$*: exit $rc, want 2"; }
  [ "$(grep -c 'memtrain: error:' err.txt)" = 1 ] || { cat err.txt; fail "$*: error lines"; }
  grep -qF -- "$pattern" err.txt || { cat err.txt; fail "$*: no '$pattern'"; }
  echo "ok: $(grep 'memtrain: error:' err.txt)"
}
expect_error "--folder 'nowhere': no such folder" --folder nowhere --out data/train.h5
mkdir -p flat && cp imgs/ant/00.jpg flat/
expect_error "--folder 'flat' has no class subfolders" --folder flat --out data/train.h5
mkdir -p junk/k && printf 'x' >junk/k/a.png
expect_error "no readable image (1 .jpg/.jpeg/.png files skipped" --folder junk --out data/train.h5
expect_error "--val-fraction 1 is not in [0, 1)" --folder imgs --out data/train.h5 --val-fraction 1
printf 'filename,label\na.jpg,ant\nb.jpg,dog\n' >split-bad.csv
expect_error "--classes 'split-bad.csv' line 3: class 'dog' has no folder 'imgs/dog'" \
  --folder imgs --out data/train.h5 --classes split-bad.csv
printf 'ant\ncow\nant\n' >split-twice.txt
expect_error "--classes 'split-twice.txt' line 3: class 'ant' again (first on line 1)" \
  --folder imgs --out data/train.h5 --classes split-twice.txt
printf 'filename,class\na.jpg,ant\n' >split-nolabel.csv
expect_error "--classes 'split-nolabel.csv' line 1: a CSV header without a 'label' column" \
  --folder imgs --out data/train.h5 --classes split-nolabel.csv
expect_error "--classes 'nofile.csv': cannot open" --folder imgs --out data/train.h5 --classes nofile.csv
cmp -s keep.h5 data/train.h5 || fail "a failed run changed data/train.h5"
! ls data/*.tmp.* 2>/dev/null || fail "temporary files left"
echo "e2e convert_images: ok"
