#!/usr/bin/env bash
# memtrain convert-captions against open_clip 3.3.0 (issue 32): an image
# folder and a tab-separated CSV in open_clip's CsvDataset convention with
# captions in several scripts, accents, emoji, curly quotes, ligatures,
# full-width characters, HTML entities, punctuation runs, digits,
# contractions, one longer than 77 tokens, ones of a space (an empty one is
# refused: pandas reads NaN, open_clip 'nan'), one quoted with the
# separator, a newline and doubled quotes inside; a truncated JPEG, a
# missing image, an empty image path, and one image named three ways.
# Checks, with exact values:
# - exit 0, the summary line, each skipped or truncated row on stderr by
#   CSV line (path or caption start, reason);
# - /tokens id for id as open_clip.tokenize (tests/peers/open_clip_tokens.py),
#   /captions as written, /pair_ids (one id per image, by first row), the
#   split by image (split_key/val_count recomputed here), /images byte for
#   byte as convert-images writes the same files, the attributes;
# - bad inputs exit 2 with one error line (a missing column names the
#   columns found and the option), outputs untouched, no temporary file.
# Python: the torch venv (open_clip, h5py, numpy, PIL: launch/install_peers.sh);
# without open_clip the test says so and is skipped (77).
source "$(dirname "$0")/common.sh"
MPY=${MEMTRAIN_TORCH_VENV:-/opt/memtrain/torch-venv}/bin/python
if ! "$MPY" -c 'import open_clip, h5py, numpy, PIL' >/dev/null 2>&1; then
  echo "SKIP: no open_clip in $MPY: run bash launch/install_peers.sh" >&2
  exit 77
fi
export PYTHONPATH=$PEER_SCRIPTS

"$MPY" - <<'PYEOF'
import json, os
import numpy as np
from PIL import Image
rng = np.random.default_rng(11)
os.makedirs("data/imgs/sub", exist_ok=True)
good = []
for i in range(10):
    h, w = 30 + 5 * i, 60 - 3 * i
    a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    name = f"imgs/{'sub/' if i % 4 == 3 else ''}im{i}.{'jpg' if i % 3 == 0 else 'png'}"
    im = Image.fromarray(a)
    if i % 5 == 2:
        im = im.convert("L")
    im.save("data/" + name, quality=90)
    good.append(name)
whole = open("data/" + good[0], "rb").read()
open("data/imgs/broken.jpg", "wb").write(whole[: len(whole) // 2])
long_caption = " ".join(f"word{i}" for i in range(60))
quoted = 'quoted\tcaption with the separator\nand a newline, "doubled" quotes'
captions = [
    "A photo of a cat.",
    "Ça coûte 5€ — naïve café façade",
    "Москва зимой, 2021 год",
    "東京タワーの夜景",
    "مرحبا بالعالم",
    "😀🎉 party time! 👩‍👩‍👧",
    "“Curly” ‘quotes’ it’s",
    "ﬁne ﬂour ﬀ ĳ",
    "ＦＵＬＬ ｗｉｄｔｈ　１２３ ｶﾀｶﾅ",
    "Tom &amp; Jerry &lt;3 &eacute;t&eacute; &#39;hi&#39; &hellip; &NTILDE; &amp;amp;",
    "Wow!!! ... ??? --- (really?) $$$ #hashtag @user",
    "I'll we're they've I'm you'd don't CAN'T it'S",
    long_caption,
    " ",
    quoted,
    "Ελληνικά ΟΔΟΣ",
    "Straße İstanbul",
    "हिन्दी भाषा",
    "<b>bold</b> &amp; &rsquo;",
    "x² ½ ③ 2023年 ٣",
    "e\u0301cole nbsp\u00a0here  many   spaces",
    " ",
]
# (path, caption): every caption once, images reused; a(0) and b(1) are
# named three ways each; broken, missing and empty paths.
spell = {0: ["imgs/im0.jpg", "./imgs/im0.jpg", "imgs/sub/../im0.jpg"],
         1: ["imgs/im1.png", "imgs//im1.png", "./imgs/im1.png"]}
rows, use = [], {0: 0, 1: 0}
for k, c in enumerate(captions):
    i = k % 10
    if i in spell:
        p = spell[i][use[i] % 3]
        use[i] += 1
    else:
        p = good[i]
    rows.append((p, c))
rows.insert(3, ("imgs/broken.jpg", "a broken image"))
rows.insert(8, ("imgs/missing.png", "a missing image"))
rows.insert(11, ("", "no image path"))
rows.append(("imgs/sub/../im0.jpg", "third name of image 0"))

def q(s):  # pandas reads this back as s
    return '"' + s.replace('"', '""') + '"' if any(ch in s for ch in '\t\n"') else s
text, lines = "filepath\ttitle\n", []
for p, c in rows:
    lines.append(text.count("\n") + 1)
    text += f"{p}\t{q(c)}\n"
    if len(lines) == 5:
        text += "\n"  # a blank line: skipped, but counted
open("caps.csv", "w", encoding="utf-8", newline="").write(text)
json.dump({"rows": rows, "lines": lines, "good": good}, open("rows.json", "w"))

err = []
for (p, c), line in zip(rows, lines):
    if p == "":
        err.append(f"skipped: line {line}: '': empty image path (filepath)")
    elif p == "imgs/broken.jpg":
        err.append(f"skipped: line {line}: data/imgs/broken.jpg: JPEG (libjpeg): Premature end of JPEG file")
    elif p == "imgs/missing.png":
        err.append(f"skipped: line {line}: data/imgs/missing.png: no such file")
    elif c == long_caption:
        err.append(f"truncated: line {line}: '{c[:40]}...': 172 tokens with start "
                   "and end, cut to --context-length 77 (the end token kept last)")
open("want_err.txt", "w").write("\n".join(err) + "\n")
PYEOF

# --- the conversion ------------------------------------------------------------
"$MEMTRAIN" convert-captions --csv caps.csv --images-root data --out out/pairs.h5 \
  --size 32 --val-fraction 0.25 --seed 5 >log.txt 2>err.txt ||
  { cat log.txt err.txt; fail "convert-captions"; }
cat log.txt err.txt
diff want_err.txt err.txt || fail "the per-row reports on stderr differ (want < > got)"
grep -qxF "rows: 26; written: 23 (train 19, val 4); skipped (broken): 3; captions truncated: 1" log.txt ||
  fail "summary line"
grep -qxF "wrote out/pairs.h5 (train): /images [19, 3, 32, 32] uint8, /tokens [19, 77] int32, 8 images" log.txt ||
  fail "train line"
grep -qxF "wrote out/pairs-val.h5 (val): /images [4, 3, 32, 32] uint8, /tokens [4, 77] int32, 2 images" log.txt ||
  fail "val line"

# /images as convert-images writes them: the good images in a class folder.
mkdir -p folder/all
"$MPY" -c '
import json, shutil
for i, p in enumerate(json.load(open("rows.json"))["good"]):
    shutil.copy("data/" + p, "folder/all/%02d_%s" % (i, p.replace("/", "_")))'
"$MEMTRAIN" convert-images --folder folder --out ref/images.h5 --size 32 \
  --val-fraction 0 >/dev/null || fail "convert-images (reference)"

"$MPY" - <<'PYEOF' || fail "contents"
import json, os
import h5py, numpy as np
from open_clip_tokens import tokens
from split_rule import by_split_key
d = json.load(open("rows.json"))
good = d["good"]
with h5py.File("ref/images.h5") as h:  # class folder rows sorted by name
    ref_px = {good[i]: h["images"][i] for i in range(len(good))}
# Images by normalised path, named by their first spelling; the split:
# floor(0.25 n + 0.5) smallest keys over every image the CSV names.
first = {}
for p, c in d["rows"]:
    if p:
        first.setdefault(os.path.normpath(p), os.path.normpath(p))
names = by_split_key(first.values(), 5)
n_val = int(np.floor(0.25 * len(names) + 0.5))
assert len(names) == 12 and n_val == 3, (len(names), n_val)
val_images = set(names[:n_val])
want = {"train": [], "val": []}
for p, c in d["rows"]:
    n = os.path.normpath(p) if p else ""
    if n in ("", "imgs/broken.jpg", "imgs/missing.png"):
        continue
    want["val" if n in val_images else "train"].append((n, c))
for split, path in [("train", "out/pairs.h5"), ("val", "out/pairs-val.h5")]:
    rows = want[split]
    with h5py.File(path, "r") as h:
        t, x, ids = h["tokens"], h["images"], h["pair_ids"][:]
        caps = [s.decode("utf-8") for s in h["captions"][:]]
        assert t.dtype == np.int32 and t.shape == (len(rows), 77), t.shape
        assert x.dtype == np.uint8 and x.shape == (len(rows), 3, 32, 32), x.shape
        assert ids.dtype == np.int64 and ids.shape == (len(rows),)
        assert caps == [c for _, c in rows], (caps, rows)
        ref = tokens([c for _, c in rows], 77)
        for i, (n, c) in enumerate(rows):
            got = t[i].tolist()
            assert got == ref[i], f"{split} row {i} {c!r}:\n got  {got}\n want {ref[i]}"
            assert np.array_equal(x[i], ref_px[n]), f"{split} row {i}: pixels of {n}"
        order = []
        for n, _ in rows:
            if n not in order:
                order.append(n)
        assert ids.tolist() == [order.index(n) for n, _ in rows], ids.tolist()
        a = h.attrs
        assert t.attrs["vocab_size"] == 49408 and a["vocab_size"] == 49408
        assert t.attrs["start_token"] == 49406 and t.attrs["end_token"] == 49407
        assert a["kind"].decode() == "pairs" and a["split"].decode() == split
        assert a["generator"].decode() == "memtrain convert-captions"
        assert a["num_pairs"] == len(rows) and a["num_images"] == len(order)
        assert a["skipped_rows"] == 3 and a["truncated_captions"] == 1
        assert a["context_length"] == 77 and a["image_size"] == 32
        assert abs(x.attrs["scale"] - 1 / 255) < 1e-12 and x.attrs["shift"] == 0
        print(f"ok: {split}: {len(rows)} rows, {len(order)} images, tokens = open_clip's, "
              "pixels = convert-images'")
long_row = [r for r in want["train"] + want["val"] if r[1].startswith("word0")][0]
ids = tokens([long_row[1]], 77)[0]
assert ids[0] == 49406 and ids[76] == 49407 and 0 not in ids
assert tokens([""], 77)[0][:3] == [49406, 49407, 0]
PYEOF

# --context-length 16, no split, no /captions; --sep ',' on a comma CSV.
"$MPY" -c '
import csv
rows = list(csv.reader(open("caps.csv", encoding="utf-8", newline=""), delimiter="\t"))
csv.writer(open("comma.csv", "w", encoding="utf-8", newline=""), lineterminator="\n").writerows(rows)'
"$MEMTRAIN" convert-captions --csv comma.csv --sep , --images-root data \
  --out short/s.h5 --size 16 --context-length 16 --no-captions >short.txt 2>short_err.txt ||
  { cat short.txt short_err.txt; fail "--context-length 16"; }
[ ! -e short/s-val.h5 ] || fail "--val-fraction 0 wrote a val file"
"$MPY" - <<'PYEOF' || fail "--context-length 16"
import json
import h5py
from open_clip_tokens import tokens
rows = json.load(open("rows.json"))["rows"]
caps = [c for p, c in rows if p not in ("", "imgs/broken.jpg", "imgs/missing.png")]
with h5py.File("short/s.h5") as h:
    assert "captions" not in h and h["tokens"].shape == (23, 16), h["tokens"].shape
    assert h["tokens"][:].tolist() == tokens(caps, 16)
print("ok: --context-length 16 = open_clip.tokenize(context_length=16), --sep ',', --no-captions")
PYEOF
[ "$(grep -c '^truncated: ' short_err.txt)" -ge 2 ] || fail "--context-length 16: truncations"

# --- bad inputs: exit 2, one error line, nothing touched ---------------------
cp out/pairs.h5 keep.h5
expect_error() {  # PATTERN ARGS...
  local pattern=$1 rc=0
  shift
  "$MEMTRAIN" convert-captions "$@" >o.txt 2>e.txt || rc=$?
  [ "$rc" = 2 ] || { cat o.txt e.txt; fail "$*: exit $rc, want 2"; }
  [ "$(grep -c 'memtrain: error:' e.txt)" = 1 ] || { cat e.txt; fail "$*: error lines"; }
  grep -qF -- "$pattern" e.txt || { cat e.txt; fail "$*: no '$pattern'"; }
  echo "ok: $(grep 'memtrain: error:' e.txt)"
}
expect_error "has no column 'caption' (--caption-key); its header (separator \\t (tab), --sep) has 2 column(s): 'filepath', 'title'; pass --caption-key NAME" \
  --csv caps.csv --images-root data --out out/pairs.h5 --caption-key caption
expect_error "has no column 'filepath' (--img-key); its header (separator \\t (tab), --sep) has 1 column(s): 'filepath,title'; pass --img-key NAME; the header has one column holding ',': try --sep ," \
  --csv comma.csv --images-root data --out out/pairs.h5
expect_error "convert-captions: cannot open the CLIP BPE vocabulary 'nowhere.txt.gz' (pass --bpe FILE" \
  --csv caps.csv --out out/pairs.h5 --bpe nowhere.txt.gz
MEMTRAIN_CLIP_BPE= MEMTRAIN_TORCH_VENV=/nowhere expect_error \
  "no CLIP BPE vocabulary found (looked at \$MEMTRAIN_CLIP_BPE (not set), /nowhere/lib/python3.*/site-packages/open_clip/bpe_simple_vocab_16e6.txt.gz); pass --bpe FILE" \
  --csv caps.csv --out out/pairs.h5
expect_error "--csv 'none.csv': no such file" --csv none.csv --out out/pairs.h5
expect_error "no usable row (26 of 26 skipped" --csv caps.csv --images-root nowhere --out out/pairs.h5
printf 'filepath\ttitle\nimgs/im1.png\t"open\n' >open.csv
expect_error "line 2, column 'title' (field 2): a quoted field (\") is not closed" --csv open.csv --images-root data --out out/pairs.h5
printf 'filepath\ttitle\nimgs/im1.png\tcats\nimgs/im2.png\t\n' >empty.csv
expect_error "line 3, column 'title' (field 2): empty caption (pandas reads NaN" --csv empty.csv --images-root data --out out/pairs.h5
printf 'filepath\ttitle\n../data/imgs/im1.png\tcats\n' >up.csv
expect_error "line 2, column 'filepath' (field 1): '../data/imgs/im1.png' leaves --images-root 'data'" --csv up.csv --images-root data --out out/pairs.h5
expect_error "--val-fraction 1 is not in [0, 1)" --csv caps.csv --out out/pairs.h5 --val-fraction 1
expect_error "--sep 'ab' is not one character" --csv caps.csv --out out/pairs.h5 --sep ab
cmp -s keep.h5 out/pairs.h5 || fail "a failed run changed out/pairs.h5"
! ls out/*.tmp.* 2>/dev/null || fail "temporary files left"
echo "e2e convert_captions: ok"
