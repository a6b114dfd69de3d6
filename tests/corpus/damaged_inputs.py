#!/usr/bin/env python3
"""The damaged-input corpus (issue 35, point 7).

Builds, in a temporary folder, damaged NIfTI headers (NIfTI-1, NIfTI-2,
Analyze), dataset folders, image folders, caption CSVs (caption_cases.py),
HDF5 files, configs and options, runs each against the memtrain command
that reads it, and asserts the verdict the issue requires:

- refused: exit status 2, exactly one `memtrain: error:` line on stderr,
  naming the file (its path or basename) and the field (header field, HDF5
  dataset, config key or option); nothing written (an output that did not
  exist still does not, one that existed is byte-identical), no `.tmp.*`
  file left, no signal, no hang;
- or accepted with the right data: exit 0, and the output is what nibabel
  (or h5py) makes of the same input.

Usage: damaged_inputs.py [--memtrain PATH] [--work DIR] [--list] [-k SUBSTR]
                         [-j JOBS] [--keep] [--timeout S]
MEMTRAIN (environment) is the default of --memtrain. One line per case
(`ok` / `FAIL` and the reason), a summary; exit status 1 when a case fails.
Needs numpy, nibabel and h5py (the peers venv, launch/install_peers.sh).
"""
import argparse
import concurrent.futures
import errno
import gzip
import io
import json
import logging
import math
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zipfile
import zlib

import h5py
import nibabel as nib
import numpy as np

import caption_cases

# nibabel reads some of the damaged headers here; its warnings are not ours.
logging.getLogger("nibabel").setLevel(logging.ERROR)

# The option that lets convert-nifti read an Analyze 7.5 .hdr/.img pair,
# with an explicit orientation (issue 35, point 1).
ANALYZE_OPTION = "--analyze-orientation"

# A case that runs longer is a hang.
TIMEOUT_S = 20
# Address-space limit of each memtrain process: a case that would allocate
# its way to a refusal (a 16 GB resample grid, a 512 GiB label array, a
# config read from /dev/zero) fails here instead of taking the machine's
# memory. memtrain itself needs well under 2 GiB for every case.
MEMORY_LIMIT = 6 << 30

ERROR = "memtrain: error:"
# The executable under test (main() sets it; the predict fixture runs it).
MEMTRAIN_PATH = [None]

# ---------------------------------------------------------------------------
# Inputs


def base_volume(seed=0, shape=(8, 9, 7)):
    """A small image (float32, with a zero background) and its labels."""
    x, y, z = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in shape], indexing="ij")
    img = 100 + 40 * np.sin(x / 2 + seed) + 25 * np.cos(y / 3) + 6 * z
    img[0, :, :] = 0  # background: the z-score is over the non-zero voxels
    img[:, -1, :] = 0
    lbl = ((x - 3.5) ** 2 / 9 + (y - 4 - seed % 2) ** 2 / 12 + (z - 3) ** 2 / 6 < 1)
    return img.astype(np.float32), lbl.astype(np.uint8)


# RAS storage, 2 x 3 x 4 mm voxels.
AFFINE = np.array([[2.0, 0, 0, -7], [0, 3.0, 0, -12], [0, 0, 4.0, -12], [0, 0, 0, 1]])


def flipped(data, aff, axes):
    """The same world stored with voxel axes `axes` reversed."""
    aff = aff.copy()
    for a in axes:
        aff[:3, 3] += aff[:3, a] * (data.shape[a] - 1)
        aff[:3, a] = -aff[:3, a]
        data = np.flip(data, a)
    return np.ascontiguousarray(data), aff


def nifti_bytes(data, affine=AFFINE, *, two=False, edit=None, magic=None,
                data_at=None, slope=(1.0, 0.0), swap=False, qform=1, sform=1,
                dtype=None, body=None):
    """A single-file NIfTI-1 (or -2 with two=True) image's bytes.

    edit: {field: value} or {(field, index): value} set in the header
    after nibabel filled it (so that any value, valid or not, can be
    written); data_at: where the voxels are (default right after the
    header and its 4 extension bytes; vox_offset says so unless edited).
    """
    cls = nib.Nifti2Image if two else nib.Nifti1Image
    im = cls(data, affine)
    im.set_qform(affine, qform)
    im.set_sform(affine, sform)
    h = im.header
    h.set_data_dtype(dtype or data.dtype)
    if swap:
        h = h.as_byteswapped(">")
    if body is None:
        body = np.asarray(data, dtype=h.get_data_dtype()).tobytes(order="F")
    s = h.structarr
    hsize = 540 if two else 348
    data_at = hsize + 4 if data_at is None else data_at
    s["vox_offset"] = data_at
    s["scl_slope"], s["scl_inter"] = slope
    if magic is not None:
        s["magic"] = magic
    for k, v in (edit or {}).items():
        if isinstance(k, tuple):
            s[k[0]][k[1]] = v
        else:
            s[k] = v
    hb = s.tobytes()
    assert len(hb) == hsize
    return hb + b"\0" * (data_at - hsize) + body


def write(path, raw, gz=None, cut=None, gzip_with=None):
    """Writes raw (gzip-compressed when the name ends in .gz, or gz=True:
    gzip level 6, or gzip_with(raw)'s bytes, e.g. a damaged stream made by
    one of the gz_* below), then keeps only `cut` bytes of the file (a
    negative cut drops bytes; a fraction in (0, 1) keeps that share)."""
    if gz if gz is not None else path.endswith(".gz"):
        raw = (gzip_with or (lambda r: gzip.compress(r, 6, mtime=0)))(raw)
    if cut is not None:
        raw = raw[:int(len(raw) * cut) if 0 < cut < 1 else cut]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(raw)


def nii(path, data, affine=AFFINE, *, cut=None, gz=None, gzip_with=None, **kw):
    write(path, nifti_bytes(data, affine, **kw), gz=gz, cut=cut, gzip_with=gzip_with)


# Damaged gzip streams that still inflate (gzip_with= of write and nii):
# only the member's trailer (RFC 1952: CRC-32, then ISIZE, the length mod
# 2^32) or what follows the member tells.


def deflate(raw, level):
    """raw deflate data (level 0: stored blocks, the bytes as they are)."""
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    return c.compress(raw) + c.flush()


def gz_member(raw, body, *, isize=None, align=False):
    """A gzip member: header, `body` (deflate data), then the CRC-32 and
    ISIZE of raw (or `isize`). align: a file name (FNAME) in the header as
    long as puts the trailer at a multiple of 8 KiB of the file; zlib's
    gzread reads its input 8 KiB at a time and returns once the reader's
    buffer is full, so a reader that stops at the last voxel (libnifti)
    never reaches such a trailer."""
    def head(name):
        return (b"\x1f\x8b\x08" + (b"\x08" if name else b"\0") + bytes(4) + b"\0\x03" +
                (name + b"\0" if name else b""))
    name = b""
    if align:
        name = b"x" * (1 + (-(len(head(b"x")) + len(body))) % 8192)
    return head(name) + body + struct.pack(
        "<II", zlib.crc32(raw), (len(raw) if isize is None else isize) & 0xFFFFFFFF)


def gz_stored_flip(at, align=False):
    """Stored blocks with the byte of uncompressed offset `at` changed: it
    inflates to the right length, only the CRC-32 differs."""
    def make(raw):
        z = bytearray(deflate(raw, 0))
        pos, out = 0, 0
        while True:
            assert z[pos] & 6 == 0, "not a stored block"
            n = struct.unpack_from("<H", z, pos + 1)[0]
            if out <= at < out + n:
                z[pos + 5 + at - out] ^= 0x01
                return gz_member(raw, bytes(z), align=align)
            assert not z[pos] & 1, f"offset {at} past the data"
            pos, out = pos + 5 + n, out + n
    return make


def gz_isize(delta, align=False):
    """A good member whose ISIZE is off by `delta`."""
    return lambda raw: gz_member(raw, deflate(raw, 6), isize=len(raw) + delta, align=align)


def gz_members(split, second=None, tail=b""):
    """raw[:split] and raw[split:] as two members (legal gzip, as `cat a.gz
    b.gz` makes), the second made by second(bytes) (default: level 6), then
    `tail` appended."""
    good = lambda r: gz_member(r, deflate(r, 6))
    return lambda raw: good(raw[:split]) + (second or good)(raw[split:]) + tail


def pair(stem, data, affine=AFFINE, *, magic=b"ni1", analyze=False, edit=None):
    """A .hdr/.img pair: NIfTI-1 (magic ni1, or the given one) or Analyze 7.5."""
    if analyze:
        h = nib.AnalyzeHeader()
        h.set_data_shape(data.shape)
        h.set_data_dtype(data.dtype)
        h.set_zooms(tuple(np.abs(np.diag(affine)[:3])))
        s = h.structarr
    else:
        im = nib.Nifti1Pair(data, affine)
        im.set_qform(affine, 1)
        im.set_sform(affine, 1)
        h = im.header
        h.set_data_dtype(data.dtype)
        s = h.structarr
        s["vox_offset"] = 0
        s["scl_slope"], s["scl_inter"] = 1.0, 0.0
        s["magic"] = magic
    for k, v in (edit or {}).items():
        if isinstance(k, tuple):
            s[k[0]][k[1]] = v
        else:
            s[k] = v
    write(stem + ".hdr", s.tobytes())
    write(stem + ".img", np.asarray(data, dtype=h.get_data_dtype()).tobytes(order="F"))


def png_bytes(w, h, seed):
    """An 8-bit RGB PNG, written here (no imaging library needed)."""
    rng = np.random.default_rng(seed)
    px = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    rows = b"".join(b"\0" + px[r].tobytes() for r in range(h))

    def chunk(tag, payload):
        return (struct.pack(">I", len(payload)) + tag + payload +
                struct.pack(">I", zlib.crc32(tag + payload) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" +
            chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


# ---------------------------------------------------------------------------
# Verdicts


class Failure(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Failure(msg)


def named(text, path):
    """Does text name the file: its path as given, or its basename? (A
    tuple: any of those files, when more than one is damaged.)"""
    if isinstance(path, tuple):
        return any(named(text, p) for p in path)
    base = os.path.basename(path.rstrip("/"))
    return path in text or base in text


def line_pattern(regex):
    return re.compile(regex, re.IGNORECASE)


class Refused:
    """Exit 2, one `memtrain: error:` line naming the file and the field."""

    def __init__(self, file, *fields, outputs=(), existing=False, where="stderr"):
        self.file = file          # path relative to the case folder (a tuple:
                                  # any of them), or None
        self.fields = [line_pattern(f) for f in fields]
        self.outputs = list(outputs)
        self.existing = existing  # outputs made before the run: unchanged after
        self.where = where        # "stderr": the error line; "any": inspect's report

    def prepare(self, d):
        for o in self.outputs:
            if self.existing:
                os.makedirs(os.path.dirname(os.path.join(d, o)) or d, exist_ok=True)
                write(os.path.join(d, o), b"an earlier output, to be left alone\n")

    def check(self, d, rc, out, err, ctx):
        lines = [l for l in err.splitlines() if ERROR in l]
        if self.where == "stderr":
            need(rc == 2, f"exit {rc}, want 2")
            need(len(lines) == 1, f"{len(lines)} '{ERROR}' lines on stderr, want 1")
            text = lines[0]
        else:  # inspect: its report (stdout) or one error line
            need(rc == 2, f"exit {rc}, want 2")
            need(len(lines) <= 1, f"{len(lines)} '{ERROR}' lines on stderr")
            text = out + "\n" + err
        if self.file is not None:
            need(named(text, self.file), f"the message does not name {self.file!r}")
        for f in self.fields:
            need(f.search(text), f"the message does not match /{f.pattern}/")
        for o in self.outputs:
            p = os.path.join(d, o)
            if self.existing:
                need(open(p, "rb").read() == b"an earlier output, to be left alone\n",
                     f"existing output '{o}' was changed")
            else:
                need(not os.path.exists(p), f"output '{o}' was written")


class Accepted:
    """Exit 0 and check(d, ctx, out, err) passes."""

    def __init__(self, check):
        self.checkf = check

    def prepare(self, d):
        pass

    def check(self, d, rc, out, err, ctx):
        need(rc == 0, f"exit {rc}, want 0")
        need(ERROR not in err, "an error line with exit 0")
        self.checkf(d, ctx, out, err)


# A summary that counts a skipped or ignored entry.
COUNTED = re.compile(r"(skipped|ignored|unreadable)[^:\n]*:\s*[1-9]", re.IGNORECASE)


class NamedOrRefused:
    """The input is never silently dropped: either the run is refused
    (Refused's rules, naming the file) or it succeeds, names the file (or
    counts it as skipped) in its output, and check(d, ctx, out, err) passes."""

    def __init__(self, file, check, outputs=()):
        self.file = file
        self.refused = Refused(file, outputs=outputs)
        self.checkf = check

    def prepare(self, d):
        pass

    def check(self, d, rc, out, err, ctx):
        if rc == 2:
            self.refused.check(d, rc, out, err, ctx)
            return
        need(rc == 0, f"exit {rc}, want 0 (the file named or counted) or 2 (refused)")
        need(named(out + err, self.file) or COUNTED.search(out + err),
             f"exit 0 and '{self.file}' is neither named nor counted")
        self.checkf(d, ctx, out, err)


class Custom:
    def __init__(self, check):
        self.checkf = check

    def prepare(self, d):
        pass

    def check(self, d, rc, out, err, ctx):
        self.checkf(d, rc, out, err, ctx)


class Case:
    def __init__(self, name, build, argv, verdict, during=None):
        self.name = name
        self.build = build        # build(d) -> ctx (anything), inputs in folder d
        self.argv = argv          # argv(ctx) -> memtrain's arguments (cwd = d)
        self.verdict = verdict
        self.during = during      # during(d, ctx, done_event): a thread while it runs


CASES = []


def case(name, build, argv, verdict, during=None):
    assert all(c.name != name for c in CASES), name
    CASES.append(Case(name, build, argv, verdict, during))


# ---------------------------------------------------------------------------
# Expected data (nibabel, h5py)


def nib_array(path):
    """nibabel's voxel values (slope and intercept applied), float64."""
    return np.asarray(nib.load(path).dataobj, dtype=np.float64)


def check_convert_nifti(out, img, lbl, spacing=None, channels=1):
    """convert-nifti's file against nibabel's reading of img and lbl:
    /volumes[0, t, k, j, i] = voxel (i, j, k) of volume t, stored as the
    file stores it; scale, shift = the z-score over the non-zero voxels;
    /masks[0, k, j, i]; spacing_mm = |pixdim| [D, H, W] (or `spacing`)."""
    def check(d, ctx, o, e):
        x = nib_array(os.path.join(d, img))
        if x.ndim == 3:
            x = x[..., None]
        need(x.shape[3] == channels, f"test: nibabel reads {x.shape[3]} channels")
        want = x.transpose(3, 2, 1, 0)
        need(os.path.exists(os.path.join(d, out)), f"no output '{out}'")
        with h5py.File(os.path.join(d, out), "r") as f:
            v = f["volumes"]
            need(v.shape == (1,) + want.shape, f"/volumes {v.shape}, nibabel {(1,) + want.shape}")
            need(v.dtype == np.float32, f"/volumes {v.dtype}")
            got = v[0].astype(np.float64)
            diff = np.abs(got - want).max()
            need(np.allclose(got, want, rtol=1e-5, atol=1e-3),
                 f"/volumes differs from nibabel's voxels by up to {diff:g}")
            lab = np.rint(nib_array(os.path.join(d, lbl))).astype(np.int64).transpose(2, 1, 0)
            m = f["masks"][0]
            need(np.array_equal(m, lab), f"/masks differs from nibabel's labels "
                 f"({int((m != lab).sum())} voxels)")
            nz = x[x != 0]
            scale, shift = 1 / nz.std(), -nz.mean() / nz.std()
            a = v.attrs
            need(np.isclose(a["scale"], scale, rtol=1e-4) and
                 np.isclose(a["shift"], shift, rtol=1e-4, atol=1e-6),
                 f"scale/shift {a['scale']:g}/{a['shift']:g}, want {scale:g}/{shift:g}")
            sp = spacing
            if sp is None:
                z = nib.load(os.path.join(d, img)).header["pixdim"][1:4]
                sp = np.abs(np.asarray(z, dtype=np.float64))[::-1]
            need(np.allclose(f.attrs["spacing_mm"], sp, rtol=1e-5),
                 f"spacing_mm {list(f.attrs['spacing_mm'])}, want {list(sp)}")
    return check


def canonical(path):
    im = nib.as_closest_canonical(nib.load(path))
    return np.asarray(im.dataobj, dtype=np.float64), im


def check_convert_dataset(prefix, folder, images, labels):
    """convert-dataset's two files against nibabel: each case's
    as_closest_canonical array [D, H, W] = transpose(2, 1, 0), z-scored over
    its non-zero voxels; its canonical labels; /case_source_affine = the
    file's affine. images/labels: {case: path}; all cases at one spacing."""
    def check(d, ctx, o, e):
        seen = set()
        for split in ("train", "val"):
            p = os.path.join(d, f"{prefix}-{split}.h5")
            need(os.path.exists(p), f"no output '{prefix}-{split}.h5'")
            with h5py.File(p, "r") as f:
                names = [n.decode() for n in f["case_names"][:]]
                shapes = f["volume_shapes"][:]
                for i, n in enumerate(names):
                    need(n in images, f"unexpected case '{n}' in {split}")
                    seen.add(n)
                    x, ci = canonical(os.path.join(d, folder, images[n]))
                    x = x.transpose(2, 1, 0)
                    nz = x[x != 0]
                    z = (x - nz.mean()) / nz.std()
                    dd, hh, ww = shapes[i]
                    need(tuple(shapes[i]) == x.shape, f"case {n}: shape {tuple(shapes[i])}, "
                         f"nibabel's canonical {x.shape}")
                    got = f["volumes"][i, 0, :dd, :hh, :ww].astype(np.float64)
                    ok = np.isclose(got, z, atol=1e-4)
                    need(ok.all(), f"case {n}: voxels differ from nibabel's canonical "
                         f"z-scored array at {int((~ok).sum())} voxels")
                    lab, _ = canonical(os.path.join(d, folder, labels[n]))
                    m = f["masks"][i, :dd, :hh, :ww]
                    need(np.array_equal(m, lab.transpose(2, 1, 0)),
                         f"case {n}: labels differ from nibabel's canonical labels")
                    src = nib.load(os.path.join(d, folder, images[n])).affine
                    need(np.allclose(f["case_source_affine"][i], src, atol=1e-4),
                         f"case {n}: case_source_affine is not nibabel's affine")
                    need(np.allclose(f["case_affine"][i], ci.affine, atol=1e-4),
                         f"case {n}: case_affine is not nibabel's canonical affine")
        need(seen == set(images), f"cases {sorted(seen)}, want {sorted(images)}")
    return check


# ---------------------------------------------------------------------------
# NIfTI headers: convert-nifti


def convert_nifti(img="img.nii", lbl="lbl.nii", out="out/x.h5", extra=()):
    return lambda ctx: ["convert-nifti", "--image", img, "--labels", lbl, "--out", out, *extra]


def nifti_case(name, *, fields, img_kw=None, lbl_kw=None, bad="img", ext=".nii",
               two=False, existing=False, extra=(), shape=(8, 9, 7)):
    """A convert-nifti case: image and labels of `shape` built with
    nii(**kw); the damaged one ('img', 'lbl' or 'both': either) is named in
    the refusal."""
    img_p, lbl_p = "img" + ext, "lbl" + ext

    def build(d):
        im, lb = base_volume(shape=shape)
        nii(os.path.join(d, img_p), im, two=two, **(img_kw or {}))
        nii(os.path.join(d, lbl_p), lb, two=two, **(lbl_kw or {}))
    file = {"img": img_p, "lbl": lbl_p, "both": (img_p, lbl_p)}[bad]
    case(name, build, convert_nifti(img_p, lbl_p, extra=extra),
         Refused(file, *fields, outputs=["out/x.h5"], existing=existing))


def nifti_accept(name, *, img_kw=None, lbl_kw=None, ext=".nii", two=False,
                 img_data=None, spacing=None, channels=1, extra=()):
    img_p, lbl_p = "img" + ext, "lbl" + ext

    def build(d):
        im, lb = base_volume()
        if img_data is not None:
            im = img_data(im)
        nii(os.path.join(d, img_p), im, two=two, **(img_kw or {}))
        nii(os.path.join(d, lbl_p), lb, two=two, **(lbl_kw or {}))
    case(name, build, convert_nifti(img_p, lbl_p, extra=extra),
         Accepted(check_convert_nifti("out/x.h5", img_p, lbl_p, spacing, channels)))


MAGIC = r"magic"
PIXDIM = lambda k: rf"pixdim\s*\[\s*{k}\s*\]"
VOX = r"vox_offset"
DIM = lambda k: rf"dim\s*\[\s*{k}\s*\]"
DTYPE = r"datatype"
TRUNC = r"truncat|too short|short|end of (the )?(file|data|stream)|premature|unexpected end|bytes"


def nifti_cases():
    # Magic.
    nifti_case("nifti/no-magic-both", fields=[MAGIC], bad="both",
               img_kw=dict(magic=b""), lbl_kw=dict(magic=b""))
    nifti_case("nifti/no-magic-image-only", fields=[MAGIC], img_kw=dict(magic=b""), existing=True)
    nifti_case("nifti/no-magic-label-only", fields=[MAGIC], bad="lbl", lbl_kw=dict(magic=b""))
    nifti_case("nifti/magic-ni1-in-nii", fields=[MAGIC], img_kw=dict(magic=b"ni1"))
    nifti_case("nifti/sizeof_hdr-0", fields=[r"sizeof_hdr|header size|magic"],
               img_kw=dict(edit={"sizeof_hdr": 0}))

    def pair_build(magic):
        def build(d):
            im, lb = base_volume()
            pair(os.path.join(d, "img"), im, magic=magic)
            nii(os.path.join(d, "lbl.nii"), lb)
        return build
    case("nifti/magic-n+1-in-hdr-pair", pair_build(b"n+1"), convert_nifti("img.hdr", "lbl.nii"),
         Refused("img.hdr", MAGIC, outputs=["out/x.h5"]))

    # pixdim of the spatial axes: finite and > 0. A negative one is refused
    # too: libnifti builds the qform with 1 in its place where nibabel takes
    # its absolute value, so the two would disagree on where the voxels are.
    for k, v, tag in ((1, 0.0, "0"), (2, 0.0, "0"), (3, 0.0, "0"), (3, np.nan, "nan"),
                      (1, np.inf, "inf"), (2, -np.inf, "-inf")):
        nifti_case(f"nifti/pixdim{k}-{tag}", fields=[PIXDIM(k)], existing=(k == 2),
                   img_kw=dict(edit={("pixdim", k): v}))
    nifti_case("nifti/pixdim3-0-label-only", fields=[PIXDIM(3)], bad="lbl",
               lbl_kw=dict(edit={("pixdim", 3): 0.0}))
    nifti_case("nifti/pixdim3-0-resample", fields=[PIXDIM(3)], bad="both",
               img_kw=dict(edit={("pixdim", 3): 0.0}), lbl_kw=dict(edit={("pixdim", 3): 0.0}),
               extra=["--resample", "2"])

    # vox_offset: >= 352 in a single file, finite; the voxels stay at 352.
    for v, tag in ((-100.0, "-100"), (np.nan, "nan"), (10.0, "10"), (348.0, "348")):
        nifti_case(f"nifti/vox_offset-{tag}", fields=[VOX], existing=(tag == "10"),
                   img_kw=dict(edit={"vox_offset": v}))

    # dim[0] in 1..7, every used dim >= 1.
    for v in (0, 8, -1):
        nifti_case(f"nifti/dim0-{v}", fields=[DIM(0)], img_kw=dict(edit={("dim", 0): v}))
    nifti_case("nifti/dim0-0-both", fields=[DIM(0)], bad="both",
               img_kw=dict(edit={("dim", 0): 0}), lbl_kw=dict(edit={("dim", 0): 0}))
    nifti_case("nifti/dim2-0", fields=[DIM(2)], img_kw=dict(edit={("dim", 2): 0}))
    nifti_case("nifti/dim4-0-of-4d", fields=[DIM(4)],
               img_kw=dict(edit={("dim", 0): 4, ("dim", 4): 0}))

    # datatype: known, and named when refused.
    nifti_case("nifti/datatype-1-binary", fields=[DTYPE, r"binary|DT_BINARY|bit"],
               img_kw=dict(edit={"datatype": 1, "bitpix": 1}))
    nifti_case("nifti/datatype-128-rgb", fields=[DTYPE, r"rgb"],
               img_kw=dict(edit={"datatype": 128, "bitpix": 24}))
    nifti_case("nifti/datatype-32-complex", fields=[DTYPE, r"complex"],
               img_kw=dict(edit={"datatype": 32, "bitpix": 64}))
    nifti_case("nifti/datatype-9999-unknown", fields=[DTYPE, r"9999"],
               img_kw=dict(edit={"datatype": 9999}))

    # Transforms: codes in 0..4, a non-singular, finite affine.
    nifti_case("nifti/sform_code-9", fields=[r"sform_code"], img_kw=dict(edit={"sform_code": 9}))
    nifti_case("nifti/qform_code--1", fields=[r"qform_code"], img_kw=dict(edit={"qform_code": -1}))
    sing = AFFINE.copy()
    sing[2, :3] = 0  # srow_z = (0, 0, 0, t): rank 2

    def singular(d):
        im, lb = base_volume()
        nii(os.path.join(d, "img.nii"), im, qform=0,
            edit={"srow_z": sing[2], "qform_code": 0})
        nii(os.path.join(d, "lbl.nii"), lb, qform=0,
            edit={"srow_z": sing[2], "qform_code": 0})
    case("nifti/sform-singular", singular, convert_nifti(),
         Refused(("img.nii", "lbl.nii"), r"sform|srow|affine|transform",
                 r"singular|rank|determinant|degenerate", outputs=["out/x.h5"]))
    nifti_case("nifti/srow-nan", fields=[r"srow|sform"],
               img_kw=dict(edit={("srow_x", 1): np.nan}))

    # Truncated data.
    size = 352 + 8 * 9 * 7 * 4
    nifti_case("nifti/truncated-data", fields=[TRUNC], img_kw=dict(cut=size - 100))
    nifti_case("nifti/truncated-gzip-stream", fields=[TRUNC + r"|gzip|compressed|stream|zlib"],
               ext=".nii.gz", img_kw=dict(cut=0.6))

    # gzip streams that inflate but are not the file's bytes (issue 56,
    # point 6): libnifti reads only the bytes it needs, and zlib checks the
    # member's trailer only when it gets there. A byte of the voxels is
    # changed (the header's checks pass). On a 32^3 grid (more than the 16
    # KiB zlib's gzread inflates at its first read) with the trailer at 8
    # KiB (gz_member's align) the file was read with exit 0; where gzread
    # did reach the trailer, its error was taken for a header of zeros
    # (sizeof_hdr = 0), a truncated file, or a count of bytes (a crash).
    GZ = r"re-export|re-download"
    BIG = (32, 32, 32)
    nifti_case("nifti/gzip-crc-mismatch", fields=[r"CRC-32", GZ], ext=".nii.gz", shape=BIG,
               img_kw=dict(gzip_with=gz_stored_flip(352 + 4 * 20000 + 1, align=True)))
    nifti_case("nifti/gzip-crc-mismatch-small", fields=[r"CRC-32", GZ], ext=".nii.gz",
               img_kw=dict(gzip_with=gz_stored_flip(352 + 4 * 200 + 1)))
    nifti_case("nifti/gzip-isize-mismatch", fields=[r"length|ISIZE", GZ], ext=".nii.gz",
               shape=BIG, bad="lbl", lbl_kw=dict(gzip_with=gz_isize(1, align=True)))
    nifti_case("nifti/gzip-second-member-crc", fields=[r"CRC-32", GZ], ext=".nii.gz",
               img_kw=dict(gzip_with=gz_members(1000, gz_stored_flip(700))))
    nifti_case("nifti/gzip-trailing-garbage", fields=[r"trailing|after the (end|last)", GZ],
               ext=".nii.gz", img_kw=dict(gzip_with=gz_members(1000, tail=b"garbage!")))

    # Accepted, with nibabel's data.
    nifti_accept("nifti/ok-baseline")
    nifti_accept("nifti/ok-gzip", ext=".nii.gz")
    # Legal gzip that libnifti (and nibabel) read: two members, one of them
    # split inside the voxels; zero padding after the last member (nibabel's
    # gzip skips it).
    nifti_accept("nifti/ok-gzip-two-members", ext=".nii.gz",
                 img_kw=dict(gzip_with=gz_members(1000)), lbl_kw=dict(gzip_with=gz_members(100)))
    nifti_accept("nifti/ok-gzip-zero-padding", ext=".nii.gz",
                 img_kw=dict(gzip_with=gz_members(1000, tail=bytes(16))))
    # A gzipped file's voxels are read by memtrain (in the pass that checks
    # the stream), not libnifti: byte order, offset, 4D, NIfTI-2 as above.
    nifti_accept("nifti/ok-gzip-big-endian", ext=".nii.gz", img_kw=dict(swap=True),
                 lbl_kw=dict(swap=True))
    nifti_accept("nifti/ok-gzip-vox_offset-400", ext=".nii.gz", img_kw=dict(data_at=400))
    nifti_accept("nifti/ok-gzip-4d", ext=".nii.gz", channels=2,
                 img_data=lambda a: np.stack([a, a * 2], axis=3))
    nifti_accept("nifti/ok-gzip-nifti2", ext=".nii.gz", two=True)
    nifti_accept("nifti/ok-scl_slope-0", img_kw=dict(slope=(0.0, 5.0)))
    nifti_case("nifti/pixdim1-negative", fields=[PIXDIM(1), "-2"], bad="both",
               img_kw=dict(edit={("pixdim", 1): -2.0}), lbl_kw=dict(edit={("pixdim", 1): -2.0}))
    nifti_accept("nifti/ok-pixdim0-qfac-0", img_kw=dict(edit={("pixdim", 0): 0.0}),
                 lbl_kw=dict(edit={("pixdim", 0): 0.0}))
    nifti_accept("nifti/ok-vox_offset-400", img_kw=dict(data_at=400))
    nifti_accept("nifti/ok-big-endian", img_kw=dict(swap=True), lbl_kw=dict(swap=True))
    nifti_accept("nifti/ok-qform-only", img_kw=dict(sform=0), lbl_kw=dict(sform=0))
    nifti_accept("nifti/ok-units-metres",
                 img_kw=dict(edit={"xyzt_units": 1, ("pixdim", 1): 0.002, ("pixdim", 2): 0.003,
                                   ("pixdim", 3): 0.004}),
                 lbl_kw=dict(edit={"xyzt_units": 1, ("pixdim", 1): 0.002, ("pixdim", 2): 0.003,
                                   ("pixdim", 3): 0.004}),
                 spacing=[4, 3, 2])
    nifti_accept("nifti/ok-4d-pixdim4-0", channels=2,
                 img_data=lambda a: np.stack([a, a * 2], axis=3),
                 img_kw=dict(edit={("pixdim", 4): 0.0}))


def nifti2_cases():
    nifti_case("nifti2/no-magic", fields=[MAGIC], two=True, img_kw=dict(magic=b""))
    nifti_case("nifti2/pixdim3-0", fields=[PIXDIM(3)], two=True,
               img_kw=dict(edit={("pixdim", 3): 0.0}))
    nifti_case("nifti2/vox_offset-10", fields=[VOX], two=True, img_kw=dict(edit={"vox_offset": 10}))
    nifti_case("nifti2/dim0-0", fields=[DIM(0)], two=True, img_kw=dict(edit={("dim", 0): 0}))
    nifti_case("nifti2/dim1-huge", fields=[DIM(1) + "|" + TRUNC], two=True,
               img_kw=dict(edit={("dim", 1): 1 << 40}))
    nifti_case("nifti2/datatype-9999", fields=[DTYPE, "9999"], two=True,
               img_kw=dict(edit={"datatype": 9999}))
    nifti_case("nifti2/sform_code-9", fields=[r"sform_code"], two=True,
               img_kw=dict(edit={"sform_code": 9}))
    nifti_accept("nifti2/ok-baseline", two=True)
    nifti_case("nifti2/pixdim2-negative-gzip", fields=[PIXDIM(2), "-3"], two=True,
               ext=".nii.gz", img_kw=dict(edit={("pixdim", 2): -3.0}))


def analyze_cases():
    def build(d):
        im, lb = base_volume()
        pair(os.path.join(d, "img"), im, analyze=True)
        pair(os.path.join(d, "lbl"), lb, analyze=True)
    case("analyze/pair-refused-without-option", build, convert_nifti("img.hdr", "lbl.hdr"),
         Refused(("img.hdr", "lbl.hdr"), MAGIC + r"|analyze", outputs=["out/x.h5"]))
    case("analyze/pair-with-option-LAS", build,
         convert_nifti("img.hdr", "lbl.hdr", extra=[ANALYZE_OPTION, "LAS"]),
         Accepted(check_convert_nifti("out/x.h5", "img.hdr", "lbl.hdr")))
    case("analyze/pair-with-bad-orientation", build,
         convert_nifti("img.hdr", "lbl.hdr", extra=[ANALYZE_OPTION, "XYZ"]),
         Refused(None, re.escape(ANALYZE_OPTION), outputs=["out/x.h5"]))

    def single(d):
        im, lb = base_volume()
        nii(os.path.join(d, "img.nii"), im, magic=b"")
        nii(os.path.join(d, "lbl.nii"), lb, magic=b"")
        nii(os.path.join(d, "twin_img.nii"), im)
        nii(os.path.join(d, "twin_lbl.nii"), lb)
    # A single file without its magic is what libnifti reads as Analyze (the
    # issue's mirrored dataset): refused without the option, read with the
    # orientation the option gives; its voxels are its NIfTI twin's (nibabel
    # reads no file without the magic).
    case("analyze/single-nii-no-magic-refused", single, convert_nifti("img.nii", "lbl.nii"),
         Refused(("img.nii", "lbl.nii"), MAGIC + r"|analyze", outputs=["out/x.h5"]))
    case("analyze/single-nii-no-magic-with-option", single,
         convert_nifti("img.nii", "lbl.nii", extra=[ANALYZE_OPTION, "LAS"]),
         Accepted(check_convert_nifti("out/x.h5", "twin_img.nii", "twin_lbl.nii")))


# ---------------------------------------------------------------------------
# predict: the same header checks on its inputs


_FIXTURE = {"lock": threading.Lock(), "dir": None, "error": None}


def predict_fixture(work, memtrain):
    """Once per run: a tiny unet3d trained on the base pair (convert-nifti,
    train), its config and weights, for the predict cases."""
    with _FIXTURE["lock"]:
        if _FIXTURE["dir"] is None and _FIXTURE["error"] is None:
            d = os.path.join(work, "_predict_fixture")
            os.makedirs(d, exist_ok=True)
            im, lb = base_volume()
            nii(os.path.join(d, "img.nii"), im)
            nii(os.path.join(d, "lbl.nii"), lb)
            with open(os.path.join(d, "u.yaml"), "w") as f:
                f.write(f"model: {{name: unet3d, feature_size: 2, depth: 1, norm: instance}}\n"
                        f"data: {{train: '{d}/t.h5', val: '', patch_size: [4, 4, 4], "
                        f"patches_per_volume: 1, batch_size: 1, read_threads: 1}}\n"
                        f"validation: {{roi: [4, 4, 4], sw_batch: 1}}\n"
                        f"training: {{epochs: 1}}\n"
                        f"output: {{dir: '{d}/run'}}\n")
            for argv in (["convert-nifti", "--image", "img.nii", "--labels", "lbl.nii",
                          "--out", "t.h5", "--chunk", "4"],
                         ["train", "--config", "u.yaml"]):
                r = subprocess.run([memtrain] + argv, cwd=d, capture_output=True, text=True,
                                   timeout=120, preexec_fn=limit_memory)
                if r.returncode != 0:
                    _FIXTURE["error"] = (f"predict fixture: memtrain {argv[0]} exit "
                                         f"{r.returncode}: {summary_of(r.stdout, r.stderr)}")
                    break
            else:
                _FIXTURE["dir"] = d
        if _FIXTURE["error"]:
            raise RuntimeError(_FIXTURE["error"])
        return _FIXTURE["dir"]


def predict_argv(ctx):
    f = ctx["fixture"]
    return ["predict", "--config", f"{f}/u.yaml", "--weights", f"{f}/run/model.safetensors",
            "--input", "case" + ctx.get("ext", ".nii"), "--out", "pred"]


def predict_case(name, fields, ext=".nii", shape=(8, 9, 7), **kw):
    def build(d):
        im, _ = base_volume(shape=shape)
        nii(os.path.join(d, "case" + ext), im, **kw)
        return {"fixture": predict_fixture(os.path.dirname(d), MEMTRAIN_PATH[0]), "ext": ext}
    case(name, build, predict_argv,
         Refused("case" + ext, *fields, outputs=["pred/case.nii.gz"]))


def predict_cases():
    predict_case("predict/no-magic", [MAGIC], magic=b"")
    predict_case("predict/pixdim3-0", [PIXDIM(3)], edit={("pixdim", 3): 0.0})
    predict_case("predict/vox_offset-10", [VOX], edit={"vox_offset": 10.0})
    predict_case("predict/dim0-0", [DIM(0)], edit={("dim", 0): 0})
    predict_case("predict/datatype-1-binary", [DTYPE, r"binary|DT_BINARY|bit"],
                 edit={"datatype": 1, "bitpix": 1})

    def ok(d, ctx, o, e):
        src = nib.load(os.path.join(d, "case.nii"))
        p = os.path.join(d, "pred", "case.nii.gz")
        need(os.path.exists(p), "no pred/case.nii.gz")
        out = nib.load(p)
        need(out.shape == src.shape, f"label map {out.shape}, input {src.shape}")
        need(np.allclose(out.affine, src.affine, atol=1e-5),
             "label map's affine is not the input's")
        v = np.asarray(out.dataobj)
        need(set(np.unique(v).tolist()) <= {0, 1}, f"classes {np.unique(v).tolist()}")

    def build(d):
        im, _ = base_volume()
        nii(os.path.join(d, "case.nii"), im)
        return {"fixture": predict_fixture(os.path.dirname(d), MEMTRAIN_PATH[0])}
    case("predict/ok-baseline", build, predict_argv, Accepted(ok))

    # --labels, the reference the prediction is scored against (issue 56,
    # point 6): a class the model does not have (the fixture's has 2), a
    # negative or a fractional label: refused before any output, naming
    # the file, the value and the model's classes.
    def labels_case(name, value, fields, dtype=np.int16):
        def build(d):
            im, lb = base_volume()
            nii(os.path.join(d, "case.nii"), im)
            lb = lb.astype(dtype)
            lb[2, 3, 4] = value
            nii(os.path.join(d, "ref.nii"), lb)
            return {"fixture": predict_fixture(os.path.dirname(d), MEMTRAIN_PATH[0])}
        case(name, build, lambda ctx: predict_argv(ctx) + ["--labels", "ref.nii"],
             Refused("ref.nii", r"\(2,3,4\)", *fields,
                     outputs=["pred/case.nii.gz", "pred/metrics.csv"]))
    labels_case("predict/labels-class-beyond", 5, [r"\b5\b", r"\b2 classes"])
    labels_case("predict/labels-negative", -1, [r"-1", r"\b2 classes"])
    labels_case("predict/labels-fraction", 0.5, [r"0\.5", r"\b2 classes"], dtype=np.float32)

    predict_case("predict/pixdim1-negative", [PIXDIM(1), "-2"], edit={("pixdim", 1): -2.0})
    predict_case("predict/gzip-crc-mismatch", [r"CRC-32", r"re-export|re-download"],
                 ext=".nii.gz", shape=(32, 32, 32), gzip_with=gz_stored_flip(352 + 4 * 20000 + 1, align=True))


# ---------------------------------------------------------------------------
# Options


def options_cases():
    def pairb(d):
        im, lb = base_volume()
        nii(os.path.join(d, "img.nii"), im)
        nii(os.path.join(d, "lbl.nii"), lb)
    GRID = r"\d+\s*[x×,]\s*\d+\s*[x×,]\s*\d+|\d\s*[KMGTPE]i?B|\d{7,}"
    for v in ("0", "-1", "nan"):
        case(f"options/resample-{v}", pairb, convert_nifti(extra=["--resample", v]),
             Refused(None, r"--resample", outputs=["out/x.h5"]))
    case("options/resample-1e-6", pairb, convert_nifti(extra=["--resample", "1e-6"]),
         Refused(None, r"--resample", GRID, outputs=["out/x.h5"]))
    case("options/resample-0.001", pairb, convert_nifti(extra=["--resample", "0.001"]),
         Refused(None, r"--resample", GRID, outputs=["out/x.h5"]))

    def dsb(d):
        make_dataset(d)
    ds = lambda *extra: (lambda ctx: ["convert-dataset", "--folder", "ds", "--out", "out/ds",
                                      "--val-fraction", "0.34", *extra])
    outs = ["out/ds-train.h5", "out/ds-val.h5"]
    case("options/spacing-1e-4", dsb, ds("--spacing", "1e-4,1e-4,1e-4"),
         Refused(None, r"--spacing", GRID, outputs=outs))
    case("options/spacing-0-1-1", dsb, ds("--spacing", "0,1,1"),
         Refused(None, r"--spacing", outputs=outs))
    case("options/spacing-nan", dsb, ds("--spacing", "nan,1,1"),
         Refused(None, r"--spacing", outputs=outs))


# ---------------------------------------------------------------------------
# Dataset folders: convert-dataset


DS_CASES = ("case_a", "case_b", "case_c")


def convert_dataset_argv(ctx):
    return ["convert-dataset", "--folder", "ds", "--out", "out/ds", "--val-fraction", "0.34"]


def make_dataset(d, ending=".nii.gz"):
    """A 3-case nnU-Net v2 folder ds/: case_a RAS, case_b stored LPS, case_c
    another image; all on 2 x 3 x 4 mm grids."""
    root = os.path.join(d, "ds")
    for i, c in enumerate(DS_CASES):
        im, lb = base_volume(seed=i)
        aff = AFFINE
        if c == "case_b":
            im, aff = flipped(im, AFFINE, (0, 1))
            lb, _ = flipped(lb, AFFINE, (0, 1))
        nii(f"{root}/imagesTr/{c}_0000{ending}", im, aff)
        nii(f"{root}/labelsTr/{c}{ending}", lb, aff)
    with open(f"{root}/dataset.json", "w") as f:
        json.dump({"channel_names": {"0": "T1"}, "labels": {"background": 0, "fg": 1},
                   "numTraining": 3, "file_ending": ending}, f)
    return root


def ds_damage(c, which, ending=".nii.gz", shape=(8, 9, 7), **kw):
    """Rewrites case c's image ('img'), label ('lbl') or both with nii(**kw);
    on another grid than the base volume's (`shape`), the other file is
    rewritten on it too, undamaged."""
    def damage(d):
        i = DS_CASES.index(c)
        im, lb = base_volume(seed=i, shape=shape)
        aff = AFFINE
        if c == "case_b":
            im, aff = flipped(im, AFFINE, (0, 1))
            lb, _ = flipped(lb, AFFINE, (0, 1))
        other = shape != (8, 9, 7)
        if which in ("img", "both") or other:
            nii(f"{d}/ds/imagesTr/{c}_0000{ending}", im, aff,
                **(kw if which in ("img", "both") else {}))
        if which in ("lbl", "both") or other:
            nii(f"{d}/ds/labelsTr/{c}{ending}", lb, aff,
                **(kw if which in ("lbl", "both") else {}))
    return damage


def dataset_case(name, damage, bad_file, *fields, ending=".nii.gz"):
    def build(d):
        make_dataset(d, ending)
        damage(d)
    case(name, build,
         convert_dataset_argv,
         Refused(bad_file, *fields, outputs=["out/ds-train.h5", "out/ds-val.h5"]))


def dataset_cases():
    img = lambda c, e=".nii.gz": f"ds/imagesTr/{c}_0000{e}"
    lbl = lambda c, e=".nii.gz": f"ds/labelsTr/{c}{e}"
    imgs = {c: f"imagesTr/{c}_0000.nii.gz" for c in DS_CASES}
    lbls = {c: f"labelsTr/{c}.nii.gz" for c in DS_CASES}
    case("dataset/ok-baseline", lambda d: make_dataset(d),
         convert_dataset_argv,
         Accepted(check_convert_dataset("out/ds", "ds", imgs, lbls)))

    dataset_case("dataset/pixdim1-negative", ds_damage("case_a", "both", edit={("pixdim", 1): -2.0}),
                 (img("case_a"), lbl("case_a")), PIXDIM(1))

    def nifti2(d):
        make_dataset(d)
        ds_damage("case_c", "both", two=True)(d)
    case("dataset/ok-nifti2-case", nifti2,
         convert_dataset_argv,
         Accepted(check_convert_dataset("out/ds", "ds", imgs, lbls)))

    dataset_case("dataset/no-magic-both", ds_damage("case_b", "both", ".nii", magic=b""),
                 (img("case_b", ".nii"), lbl("case_b", ".nii")), MAGIC, ending=".nii")
    dataset_case("dataset/no-magic-image-only", ds_damage("case_b", "img", magic=b""),
                 img("case_b"), MAGIC)
    dataset_case("dataset/no-magic-label-only", ds_damage("case_a", "lbl", magic=b""),
                 lbl("case_a"), MAGIC)
    dataset_case("dataset/pixdim2-0", ds_damage("case_a", "both", edit={("pixdim", 2): 0.0}),
                 (img("case_a"), lbl("case_a")), PIXDIM(2))
    dataset_case("dataset/pixdim3-nan-label-only",
                 ds_damage("case_c", "lbl", edit={("pixdim", 3): np.nan}), lbl("case_c"), PIXDIM(3))
    dataset_case("dataset/vox_offset-10", ds_damage("case_a", "img", ".nii",
                                                    edit={"vox_offset": 10.0}),
                 img("case_a", ".nii"), VOX, ending=".nii")
    dataset_case("dataset/dim0-0-one-case", ds_damage("case_b", "both", edit={("dim", 0): 0}),
                 (img("case_b"), lbl("case_b")), DIM(0))
    dataset_case("dataset/datatype-1-binary",
                 ds_damage("case_c", "img", edit={"datatype": 1, "bitpix": 1}),
                 img("case_c"), DTYPE, r"binary|DT_BINARY|bit")
    sing = AFFINE.copy()
    sing[1, :3] = 0
    dataset_case("dataset/sform-singular",
                 ds_damage("case_a", "both", qform=0, edit={"srow_y": sing[1], "qform_code": 0}),
                 (img("case_a"), lbl("case_a")), r"sform|srow|affine|transform|orientation",
                 r"singular|rank|determinant|degenerate|no orientation")
    dataset_case("dataset/truncated-gzip", ds_damage("case_b", "img", cut=0.8),
                 img("case_b"), TRUNC + r"|gzip|compressed|stream|zlib|header")
    dataset_case("dataset/gzip-crc-mismatch",
                 ds_damage("case_c", "lbl", shape=(32, 32, 32),
                           gzip_with=gz_stored_flip(352 + 20000, align=True)),
                 lbl("case_c"), r"CRC-32", r"re-export|re-download")

    def directory(d):
        os.remove(f"{d}/ds/imagesTr/case_b_0000.nii.gz")
        os.makedirs(f"{d}/ds/imagesTr/case_b_0000.nii.gz")
    dataset_case("dataset/directory-as-image", directory, img("case_b"), r"director")

    def dirlabel(d):
        os.remove(f"{d}/ds/labelsTr/case_c.nii.gz")
        os.makedirs(f"{d}/ds/labelsTr/case_c.nii.gz")
    dataset_case("dataset/directory-as-label", dirlabel, lbl("case_c"), r"director")
    dataset_case("dataset/missing-label",
                 lambda d: os.remove(f"{d}/ds/labelsTr/case_a.nii.gz"),
                 lbl("case_a"), r"label", r"no |missing|not found|does not exist")

    def loop(d):
        os.remove(f"{d}/ds/imagesTr/case_c_0000.nii.gz")
        os.symlink("case_c_0000.nii.gz", f"{d}/ds/imagesTr/case_c_0000.nii.gz")
    dataset_case("dataset/symlink-loop-image", loop, img("case_c"),
                 r"symbolic link|symlink|loop|too many levels|not a (regular )?file|"
                 r"cannot (open|read)|unreadable")

    # dataset.json itself (issue 56, point 6). A key written twice: JSON
    # readers keep the last silently.
    def meta(text):
        def damage(d):
            with open(f"{d}/ds/dataset.json", "w") as f:
                f.write(text)
        return damage
    rest = '"numTraining": 3, "file_ending": ".nii.gz"'
    dataset_case("dataset/json-key-twice",
                 meta('{"channel_names": {"0": "T1"}, "labels": {"background": 0, "fg": 1}, '
                      '"labels": {"background": 0, "fg": 1}, ' + rest + '}'),
                 "ds/dataset.json", r'"labels"', r"twice")
    dataset_case("dataset/json-key-twice-nested",
                 meta('{"channel_names": {"0": "T1", "0": "CT"}, '
                      '"labels": {"background": 0, "fg": 1}, ' + rest + '}'),
                 "ds/dataset.json", r'"0"', r"channel_names", r"twice")
    # numTraining against the cases: nnU-Net v2 finds them in imagesTr/,
    # MSD lists them in "training".
    dataset_case("dataset/numtraining-imagestr",
                 meta('{"channel_names": {"0": "T1"}, "labels": {"background": 0, "fg": 1}, '
                      '"numTraining": 4, "file_ending": ".nii.gz"}'),
                 "ds/dataset.json", r"numTraining", r"\b4\b", r"\b3\b")

    def msd(num_training, num_test=None, test=None, ts=0):
        def damage(d):
            j = {"modality": {"0": "T1"}, "labels": {"0": "background", "1": "fg"},
                 "numTraining": num_training,
                 "training": [{"image": f"./imagesTr/{c}.nii.gz",
                               "label": f"./labelsTr/{c}.nii.gz"} for c in DS_CASES]}
            if num_test is not None:
                j["numTest"] = num_test
            if test is not None:
                j["test"] = [f"./imagesTs/t{i}.nii.gz" for i in range(test)]
            for i in range(ts):
                nii(f"{d}/ds/imagesTs/t{i}.nii.gz", base_volume(seed=i)[0])
            with open(f"{d}/ds/dataset.json", "w") as f:
                json.dump(j, f)
        return damage
    dataset_case("dataset/numtraining-msd-list", msd(2), "ds/dataset.json",
                 r"numTraining", r"\b2\b", r"\b3\b", r"training")
    dataset_case("dataset/numtest-list", msd(3, num_test=2, test=3), "ds/dataset.json",
                 r"numTest", r"\b2\b", r"\b3\b", r"test")
    dataset_case("dataset/numtest-imagests", msd(3, num_test=3, ts=2), "ds/dataset.json",
                 r"numTest", r"\b3\b", r"\b2\b", r"imagesTs")

    def ok_msd(d):
        make_dataset(d)
        msd(3, num_test=2, test=2, ts=2)(d)
    case("dataset/ok-msd-counts", ok_msd, convert_dataset_argv,
         Accepted(check_convert_dataset("out/ds", "ds", imgs, lbls)))


# ---------------------------------------------------------------------------
# Image folders: convert-images


GOOD_IMAGES = {"ant": 3, "bee": 3}


def make_images(d):
    for c, n in GOOD_IMAGES.items():
        os.makedirs(f"{d}/imgs/{c}", exist_ok=True)
        for i in range(n):
            write(f"{d}/imgs/{c}/{i:02d}.png", png_bytes(10 + i, 9, hash((c, i)) & 0xFFFF))


def check_images(out, n):
    def check(d, ctx, o, e):
        p = os.path.join(d, out)
        need(os.path.exists(p), f"no output '{out}'")
        with h5py.File(p, "r") as f:
            need(f["images"].shape == (n, 3, 8, 8),
                 f"/images {f['images'].shape}, want ({n}, 3, 8, 8)")
            want = sorted(sum(([k] * c for k, c in enumerate(GOOD_IMAGES.values())), []))
            need(list(f["labels"][:]) == want, f"/labels {list(f['labels'][:])}, want {want}")
    return check


def images_case(name, damage, bad):
    def build(d):
        make_images(d)
        damage(d)
    n = sum(GOOD_IMAGES.values())
    case(name, build,
         lambda ctx: ["convert-images", "--folder", "imgs", "--out", "out/i.h5", "--size", "8",
                      "--val-fraction", "0"],
         NamedOrRefused(bad, check_images("out/i.h5", n), outputs=["out/i.h5"]))


def images_cases():
    images_case("images/symlink-loop-jpg",
                lambda d: os.symlink("loop.jpg", f"{d}/imgs/ant/loop.jpg"), "imgs/ant/loop.jpg")
    images_case("images/fifo-jpg", lambda d: os.mkfifo(f"{d}/imgs/bee/pipe.jpg"),
                "imgs/bee/pipe.jpg")
    images_case("images/truncated-png",
                lambda d: write(f"{d}/imgs/ant/cut.png", png_bytes(12, 12, 5)[:60]),
                "imgs/ant/cut.png")
    images_case("images/zero-byte-jpeg", lambda d: write(f"{d}/imgs/bee/empty.jpg", b""),
                "imgs/bee/empty.jpg")
    images_case("images/dangling-symlink-png",
                lambda d: os.symlink("gone.png", f"{d}/imgs/ant/dangling.png"),
                "imgs/ant/dangling.png")


# ---------------------------------------------------------------------------
# HDF5 files: train, inspect


# What a refused run must not write (its output.dir may hold rank-0.log,
# which says why it stopped).
TRAIN_OUTPUTS = ["run/model.safetensors", "run/metrics.jsonl", "run/checkpoints"]
TRAIN = ["train", "--data.val=", "--output.dir=run", "--model.hidden=8", "--model.depth=1",
         "--training.epochs=1", "--data.batch_size=16", "--data.read_threads=1"]


def make_features(d, name="good.h5", samples=64, features=4):
    p = os.path.join(d, name)
    with h5py.File(p, "w") as f:
        rng = np.random.default_rng(3)
        y = rng.integers(0, 2, samples)
        x = (rng.normal(0, 1, (samples, features)) + y[:, None]).astype(np.float32)
        f.create_dataset("features", data=x, chunks=(16, features), fletcher32=True)
        f.create_dataset("labels", data=y.astype(np.int64), chunks=(samples,), fletcher32=True)
        f.attrs["layout_version"] = 1
        f.attrs["num_classes"] = 2
    return p


def hdf5_cases():
    H5REASON = r"truncat|eof"

    def truncated(d):
        p = make_features(d, "cut.h5", samples=2048, features=16)
        raw = open(p, "rb").read()
        write(p, raw[: len(raw) * 6 // 10])
    case("hdf5/truncated-train", truncated, lambda ctx: TRAIN + ["--data.train=cut.h5"],
         Refused("cut.h5", H5REASON, r"inspect --verify", outputs=TRAIN_OUTPUTS))
    case("hdf5/truncated-inspect", truncated, lambda ctx: ["inspect", "cut.h5"],
         Refused("cut.h5", H5REASON, where="any"))

    def huge(d):
        with h5py.File(os.path.join(d, "huge.h5"), "w") as f:
            f.create_dataset("features", shape=(2 ** 36, 16), dtype="f4", chunks=(4096, 16))
            f.create_dataset("labels", shape=(2 ** 36,), dtype="i8", chunks=(65536,))
            f.attrs["num_classes"] = 2
    SIZE = r"68719476736|68,719,476,736|2\^36|\d\s*[KMGTPE]i?B|\d{9,}"
    case("hdf5/declared-2^36-rows-train", huge, lambda ctx: TRAIN + ["--data.train=huge.h5"],
         Refused("huge.h5", r"features|labels", SIZE, outputs=TRAIN_OUTPUTS))
    case("hdf5/declared-2^36-rows-inspect", huge, lambda ctx: ["inspect", "huge.h5"],
         Refused("huge.h5", r"features|labels", SIZE, where="any"))

    def text(d):
        write(os.path.join(d, "text.h5"), b"this is not HDF5\n")
    case("hdf5/text-file-train", text, lambda ctx: TRAIN + ["--data.train=text.h5"],
         Refused("text.h5", r"data\.train", r"HDF5", outputs=TRAIN_OUTPUTS))

    def fifo(d):
        os.mkfifo(os.path.join(d, "pipe.h5"))
    case("hdf5/fifo-train", fifo, lambda ctx: TRAIN + ["--data.train=pipe.h5"],
         Refused("pipe.h5", r"data\.train", r"fifo|pipe|regular|special",
                 outputs=TRAIN_OUTPUTS))

    def nanrows(value, rows):
        def build(d):
            p = make_features(d, "nan.h5")
            with h5py.File(p, "r+") as f:
                x = f["features"][:]
                for r in rows:
                    x[r, 1] = value
                f["features"][:] = x
        return build
    ROW = lambda r: rf"\brows?\b[^\n]{{0,60}}(?<![\w.]){r}(?![\w.])"
    LEAK = re.compile(r"type_error|json\.exception|\[json|terminate called|what\(\)")

    def nonfinite(stop, row):
        def check(d, rc, out, err, ctx):
            need(rc >= 0, f"killed by signal {-rc}")
            text = out + "\n" + err
            if stop:
                need(rc != 0, "exit 0 with training.nonfinite=stop")
            else:
                need(rc == 0, f"exit {rc}, want 0 (training.nonfinite=skip)")
            # One message names the file, the dataset and the row.
            hit = [l for l in text.splitlines() if "nan.h5" in l and "features" in l and
                   re.search(ROW(row), l, re.IGNORECASE)]
            need(hit, f"no line names the file 'nan.h5', the dataset '/features' and row {row}")
            leak = LEAK.search(text)
            need(not leak, f"leaked: {leak.group(0) if leak else ''}")
        return check
    case("hdf5/nan-row-skip", nanrows(np.nan, [5]),
         lambda ctx: TRAIN + ["--data.train=nan.h5", "--training.nonfinite=skip"],
         Custom(nonfinite(False, 5)))
    case("hdf5/nan-row-stop", nanrows(np.nan, [5]),
         lambda ctx: TRAIN + ["--data.train=nan.h5", "--training.nonfinite=stop"],
         Custom(nonfinite(True, 5)))
    case("hdf5/inf-row-skip", nanrows(np.inf, [41]),
         lambda ctx: TRAIN + ["--data.train=nan.h5"], Custom(nonfinite(False, 41)))


# ---------------------------------------------------------------------------
# Configs: train --config


def num(n):
    """A line number standing alone in a message."""
    return rf"(?<![\w.]){n}(?![\w.])"


# safetensors dtype -> torch.save's storage class, for torch_save.
TORCH_STORAGES = {"F32": "FloatStorage", "F64": "DoubleStorage", "F16": "HalfStorage",
                  "BF16": "BFloat16Storage", "I64": "LongStorage", "I32": "IntStorage",
                  "I16": "ShortStorage", "I8": "CharStorage", "U8": "ByteStorage",
                  "BOOL": "BoolStorage"}


def torch_save(tensors):
    """The bytes of a torch.save file of the state dict `tensors`, [(name,
    safetensors dtype, shape, data bytes)], written as PyTorch >= 1.6
    writes it (the peers venv has no torch): a zip of stored entries
    archive/data.pkl, a pickle (protocol 2) of a dict of
    torch._utils._rebuild_tensor_v2(storage, 0, shape, stride, False,
    OrderedDict()), each storage the persistent id ('storage',
    torch.<T>Storage, key, 'cpu', numel); archive/byteorder;
    archive/data/<key>, the tensor's bytes; archive/version."""
    def text(x):
        b = x.encode()
        return b"X" + struct.pack("<I", len(b)) + b

    def num(v):
        return b"J" + struct.pack("<i", v)

    def tup(items):
        return b"(" + b"".join(items) + b"t" if items else b")"
    pkl = [b"\x80\x02}("]
    for key, (name, dtype, shape, _) in enumerate(tensors):
        stride = [math.prod(shape[k + 1:]) for k in range(len(shape))]
        pid = tup([text("storage"), f"ctorch\n{TORCH_STORAGES[dtype]}\n".encode(), text(str(key)),
                   text("cpu"), num(math.prod(shape))])
        args = tup([pid + b"Q", num(0), tup([num(v) for v in shape]), tup([num(v) for v in stride]),
                    b"\x89", b"ccollections\nOrderedDict\n)R"])
        pkl.append(text(name) + b"ctorch._utils\n_rebuild_tensor_v2\n" + args + b"R")
    pkl.append(b"u.")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"".join(pkl))
        z.writestr("archive/byteorder", b"little")
        for key, (_, _, _, data) in enumerate(tensors):
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", b"3\n")
    return out.getvalue()


def zip_record_at(archive, name):
    """Where the bytes of entry `name` of a zip archive start."""
    at = zipfile.ZipFile(io.BytesIO(archive)).getinfo(name).header_offset
    n, e = struct.unpack_from("<HH", archive, at + 26)
    return at + 30 + n + e


def config_case(name, text, *fields, file="c.yaml", args=()):
    def build(d):
        make_features(d)
        write(os.path.join(d, file), text.encode())
    case(name, build,
         lambda ctx: TRAIN + ["--data.train=good.h5", "--config", file, *args],
         Refused(file, *fields, outputs=TRAIN_OUTPUTS))


def config_cases():
    config_case("config/duplicate-key", (
        "# line 1\n"
        "model:\n"
        "  hidden: 8\n"
        "training:\n"
        "  epochs: 1\n"
        "  lr: 0.1\n"          # line 6
        "  momentum: 0.9\n"
        "  lr: 500\n"),        # line 8
        r"\blr\b", r"line", num(6), num(8))
    config_case("config/duplicate-section", (
        "model:\n"
        "  hidden: 8\n"
        "training:\n"          # line 3
        "  epochs: 1\n"
        "data:\n"
        "  batch_size: 16\n"
        "training:\n"          # line 7
        "  lr: 500\n"),
        r"training", r"line", num(3), num(7))
    config_case("config/duplicate-key-flow", "training: {lr: 0.1, epochs: 1, lr: 500}\n",
                r"\blr\b", r"duplicate|twice|again|more than once|repeated")
    config_case("config/duplicate-nested-key", (
        "data:\n"
        "  episodes:\n"
        "    k_shot: 1\n"      # line 3
        "    n_query: 15\n"
        "    k_shot: 2\n"),    # line 5
        r"k_shot", num(3), num(5))
    config_case("config/unknown-key", "training:\n  lrr: 0.1\n", r"training\.lrr")
    config_case("config/empty-value", "memory:\n  budget:\n", r"memory\.budget")

    def cli(name, arg, field):
        def build(d):
            make_features(d)
        case(name, build, lambda ctx: TRAIN + ["--data.train=good.h5", arg],
             Refused(None, field, outputs=TRAIN_OUTPUTS))
    cli("config/cli-memory.budget-empty", "--memory.budget=", r"memory\.budget")
    cli("config/cli-training.lr-empty", "--training.lr=", r"training\.lr")
    # model.pretrained that is not a weights file, or holds a NaN: refused at
    # load, naming it (a FIFO never opened: it would block).
    def pretrained(name, make, *fields, file="w.safetensors", verdict=None):
        def build(d):
            make_features(d)
            make(os.path.join(d, file))
        case(name, build, lambda ctx: TRAIN + ["--data.train=good.h5", "--model.pretrained=" + file],
             verdict or Refused(file, *fields, outputs=TRAIN_OUTPUTS))

    def own_weights(d):
        """The model's own weights after one window: model.safetensors'
        bytes, its header, where its data starts."""
        r = subprocess.run([MEMTRAIN_PATH[0]] + TRAIN + ["--data.train=good.h5", "--output.dir=src",
                                                         "--training.max_windows=1"],
                           cwd=d, capture_output=True, text=True, timeout=120, preexec_fn=limit_memory)
        if r.returncode != 0:
            raise RuntimeError(f"own weights: memtrain train exit {r.returncode}: "
                               f"{summary_of(r.stdout, r.stderr)}")
        data = bytearray(open(os.path.join(d, "src", "model.safetensors"), "rb").read())
        shutil.rmtree(os.path.join(d, "src"))
        n = struct.unpack("<Q", data[:8])[0]
        return data, json.loads(data[8:8 + n]), 8 + n

    def nan_weights(path):
        # The model's own weights after one window, one value made NaN.
        data, header, base = own_weights(os.path.dirname(path))
        start = base + header["blocks.0.fc1.weight"]["data_offsets"][0]
        data[start:start + 4] = struct.pack("<f", math.nan)
        write(path, bytes(data))

    def torch_weights(damage):
        """The model's own weights as torch.save writes them; damage: a
        byte of tensor record archive/data/0 changed (stored as it is; the
        value stays finite)."""
        def make(path):
            data, header, base = own_weights(os.path.dirname(path))
            z = bytearray(torch_save([
                (k, v["dtype"], v["shape"], bytes(data[base + v["data_offsets"][0]:
                                                      base + v["data_offsets"][1]]))
                for k, v in header.items() if k != "__metadata__"]))
            if damage:
                z[zip_record_at(bytes(z), "archive/data/0") + 1] ^= 1
            write(path, bytes(z))
        return make

    def loaded(d, ctx, o, e):
        need(re.search(r"\b(\d+) of \1 tensors loaded", o + e), "no 'N of N tensors loaded'")
    def safetensors(header, data):
        def make(path):
            h = header.encode()
            write(path, struct.pack("<Q", len(h)) + h + data)
        return make
    f32 = '{"dtype": "F32", "shape": [%d], "data_offsets": [%d, %d]}'
    eight = struct.pack("<8f", *range(8))
    # What the safetensors library refuses: a name twice (the last entry
    # was kept), tensors sharing bytes (one loaded as the other's values),
    # bytes of no tensor.
    pretrained("weights/safetensors-name-twice",
               safetensors('{"a": %s, "a": %s}' % (f32 % (4, 0, 16), f32 % (4, 16, 32)), eight),
               r"'a' twice")
    pretrained("weights/safetensors-overlap",
               safetensors('{"a": %s, "b": %s}' % (f32 % (4, 0, 16), f32 % (4, 8, 24)), eight[:24]),
               r"overlap")
    pretrained("weights/safetensors-hole",
               safetensors('{"a": %s, "b": %s}' % (f32 % (2, 0, 8), f32 % (4, 16, 32)), eight),
               r"bytes 8-16")
    pretrained("weights/pretrained-fifo", os.mkfifo, r"FIFO")
    pretrained("weights/pretrained-directory", os.mkdir, r"directory")
    pretrained("weights/pretrained-nan", nan_weights, r"blocks\.0\.fc1\.weight", r"non-finite")
    # torch.save: PyTorch's miniz skips the zip entries' CRC-32, so a changed
    # tensor byte loaded with exit 0.
    pretrained("weights/torch-save-ok", torch_weights(False), file="w.pt",
               verdict=Accepted(loaded))
    pretrained("weights/torch-save-crc-mismatch", torch_weights(True), r"archive/data/0",
               r"CRC-32", r"re-download|save it again", file="w.pt")
    # Sizes of 2^63 bytes and more wrapped negative in an int64_t.
    cli("config/cli-memory.host_budget-2^64", "--memory.host_budget=10000000000000000000",
        r"memory\.host_budget.*2\^63")
    cli("config/cli-memory.budget-2^64", "--memory.budget=18446744073709551616", r"memory\.budget.*2\^63")

    # --config on non-regular files: refused (named), never read forever.
    def fifo(d):
        make_features(d)
        os.mkfifo(os.path.join(d, "c.yaml"))
    case("config/fifo-no-writer", fifo,
         lambda ctx: TRAIN + ["--data.train=good.h5", "--config", "c.yaml"],
         Refused("c.yaml", r"fifo|pipe|regular|special|empty", outputs=TRAIN_OUTPUTS))

    def feed(d, ctx, done):
        """One writer that gives the FIFO a config (with an unknown key) as
        soon as memtrain opens it for reading, once: what `--config
        <(cat c.yaml)` (a shell's process substitution) gives."""
        p = os.path.join(d, "c.yaml")
        while not done.is_set():
            try:
                fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ENXIO:
                    return
                time.sleep(0.02)
                continue
            try:
                os.set_blocking(fd, True)
                os.write(fd, b"training:\n  lrr: 0.1\n")
            except OSError:
                pass
            finally:
                os.close(fd)
            return
    case("config/fifo-with-writer", fifo,
         lambda ctx: TRAIN + ["--data.train=good.h5", "--config", "c.yaml"],
         Custom(lambda d, rc, out, err, ctx: fifo_verdict(d, rc, out, err)), during=feed)

    case("config/directory", lambda d: (make_features(d), os.makedirs(os.path.join(d, "conf.d"))),
         lambda ctx: TRAIN + ["--data.train=good.h5", "--config", "conf.d"],
         Refused("conf.d", r"director", outputs=TRAIN_OUTPUTS))
    case("config/dev-zero", lambda d: make_features(d),
         lambda ctx: TRAIN + ["--data.train=good.h5", "--config", "/dev/zero"],
         Refused("/dev/zero", outputs=TRAIN_OUTPUTS))


def fifo_verdict(d, rc, out, err):
    """Either refused as a FIFO (named) or read: then its content's unknown
    key is the refusal."""
    need(rc == 2, f"exit {rc}, want 2")
    lines = [l for l in err.splitlines() if ERROR in l]
    need(len(lines) == 1, f"{len(lines)} '{ERROR}' lines, want 1")
    need(("c.yaml" in lines[0] and re.search(r"fifo|pipe|regular|special", lines[0], re.I))
         or "training.lrr" in lines[0],
         "the message names neither the FIFO nor the key it holds (training.lrr)")
    for o in TRAIN_OUTPUTS:
        need(not os.path.exists(os.path.join(d, o)), f"output '{o}' was written")


# ---------------------------------------------------------------------------
# Leftovers: a killed writer's temporary file, an output.dir with a newline


def dead_pid():
    """A process id that no process has now (a killed writer's)."""
    top = int(open("/proc/sys/kernel/pid_max").read())
    for pid in range(top - 1, 300, -1):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    raise RuntimeError("no free pid")


def age(path, seconds=600):
    """A killed writer's file is older than the next writer: memtrain removes
    only files written a minute or more before it started (a PID means
    nothing on another host, whose rank's live file may share the folder)."""
    t = time.time() - seconds
    os.utime(path, (t, t))


def stale_said(d, ctx, o, e):
    """The stale temporary file is gone (run_case checks that no .tmp. is
    left) and the run says it removed it."""
    need(named(o + e, ctx["stale"]), f"the removal of '{ctx['stale']}' is not said")


def leftovers_cases():
    def nifti_stale(d):
        im, lb = base_volume()
        nii(os.path.join(d, "img.nii"), im)
        nii(os.path.join(d, "lbl.nii"), lb)
        stale = f"out/x.h5.tmp.{dead_pid()}"
        write(os.path.join(d, stale), b"half a file from a killed convert-nifti")
        age(os.path.join(d, stale))
        return {"stale": stale}
    convert = check_convert_nifti("out/x.h5", "img.nii", "lbl.nii")

    def both(d, ctx, o, e):
        convert(d, ctx, o, e)
        stale_said(d, ctx, o, e)
    case("leftovers/convert-nifti-stale-tmp", nifti_stale, convert_nifti(), Accepted(both))

    def train_stale(d):
        make_features(d)
        stale = f"run/model.safetensors.tmp.{dead_pid()}"
        write(os.path.join(d, stale), b"half a file from a killed run")
        age(os.path.join(d, stale))
        return {"stale": stale}
    case("leftovers/train-stale-tmp", train_stale, lambda ctx: TRAIN + ["--data.train=good.h5"],
         Accepted(stale_said))

    def newline(d):
        make_features(d)
        return {"before": set(os.listdir(d))}

    def no_stray(d, rc, out, err, ctx):
        need(rc in (0, 2), f"exit {rc}, want 0 (run inside the folder) or 2 (refused)")
        new = set(os.listdir(d)) - ctx["before"] - {"cmd.txt"}
        if rc == 2:
            lines = [l for l in err.splitlines() if ERROR in l]
            need(len(lines) == 1, f"{len(lines)} '{ERROR}' lines, want 1")
            need("output.dir" in lines[0], "the refusal does not name output.dir")
            need(not new, f"refused, but wrote {sorted(new)}")
        else:
            stray = sorted(new - {"run\nx"})
            need(not stray, f"entries outside output.dir: {stray}")
            need("run\nx" in new, "no output.dir 'run\\nx' written")
    case("leftovers/output-dir-newline", newline,
         lambda ctx: [a for a in TRAIN if not a.startswith("--output.dir=")] +
         ["--data.train=good.h5", "--output.dir=run\nx"], Custom(no_stray))


# ---------------------------------------------------------------------------
# Running


def limit_memory():
    os.setsid()
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def one_line(text, n=200):
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def summary_of(out, err, rc=0):
    """The line that best says what memtrain did: its error line, else (a
    failed run) its first line on stderr, else its last line."""
    for l in err.splitlines():
        if ERROR in l:
            return one_line(l)
    lines = [l for l in err.splitlines() if l.strip()]
    if rc != 0 and lines:
        return one_line(lines[0])
    lines = [l for l in (err + "\n" + out).splitlines() if l.strip()]
    return one_line(lines[-1]) if lines else "(no output)"


def run_case(c, memtrain, work, timeout):
    d = os.path.join(work, c.name.replace("/", "__"))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "out"))
    start = time.monotonic()
    try:
        ctx = c.build(d)
        c.verdict.prepare(d)
        argv = [memtrain] + c.argv(ctx)
    except Exception:
        return False, f"building the input: {traceback.format_exc().splitlines()[-1]}", 0.0
    done = threading.Event()
    helper = None
    if c.during:
        helper = threading.Thread(target=c.during, args=(d, ctx, done), daemon=True)
        helper.start()
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        p = subprocess.Popen(argv, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, preexec_fn=limit_memory, env=env)
    except OSError as e:
        done.set()
        return False, f"cannot run {memtrain}: {e}", 0.0
    try:
        out, err = p.communicate(timeout=timeout)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        hung = True
    done.set()
    took = time.monotonic() - start
    out, err = out.decode(errors="replace"), err.decode(errors="replace")
    with open(os.path.join(d, "cmd.txt"), "w") as f:
        f.write(" ".join(argv) + f"\nexit {p.returncode}\n--- stdout\n{out}--- stderr\n{err}")
    what = summary_of(out, err, p.returncode)
    if hung:
        return False, f"hang: killed after {timeout} s ({what})", took
    if p.returncode < 0:
        return False, f"killed by signal {signal.Signals(-p.returncode).name} ({what})", took
    temps = [os.path.join(r, n)[len(d) + 1:] for r, ds, fs in os.walk(d) for n in fs + ds
             if ".tmp." in n]
    try:
        need(not temps, f"temporary files left: {', '.join(temps)}")
        c.verdict.check(d, p.returncode, out, err, ctx)
    except Failure as e:
        return False, f"{e} | exit {p.returncode}: {what}", took
    except Exception:
        why = traceback.format_exc().splitlines()[-1]
        return False, f"checking: {why} | exit {p.returncode}: {what}", took
    return True, what, took


def all_cases():
    if not CASES:
        nifti_cases()
        nifti2_cases()
        analyze_cases()
        options_cases()
        dataset_cases()
        images_cases()
        caption_cases.add(sys.modules[__name__])
        hdf5_cases()
        config_cases()
        predict_cases()
        leftovers_cases()
    return CASES


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memtrain", default=os.environ.get("MEMTRAIN"),
                    help="the memtrain executable (default: $MEMTRAIN)")
    ap.add_argument("--work", help="folder for the inputs (default: a temporary one)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("-k", action="append", default=[], metavar="SUBSTR",
                    help="run the cases whose name contains SUBSTR (repeatable: any)")
    ap.add_argument("-j", type=int, default=min(16, 2 * (os.cpu_count() or 1)),
                    help="cases run at once")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S,
                    help="seconds before a case is a hang")
    ap.add_argument("--keep", action="store_true", help="keep the work folder even when all pass")
    a = ap.parse_args()
    cases = [c for c in all_cases() if not a.k or any(k in c.name for k in a.k)]
    if a.list:
        for c in cases:
            print(c.name)
        print(f"{len(cases)} cases", file=sys.stderr)
        return 0
    if not a.memtrain:
        ap.error("no memtrain executable: --memtrain PATH or MEMTRAIN=PATH")
    memtrain = os.path.abspath(a.memtrain)
    MEMTRAIN_PATH[0] = memtrain
    if not os.access(memtrain, os.X_OK):
        ap.error(f"'{memtrain}' is not an executable")
    if not cases:
        ap.error(f"no case matches {a.k}")
    work = os.path.abspath(a.work) if a.work else tempfile.mkdtemp(prefix="memtrain-corpus-")
    if a.work:
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
    start = time.monotonic()
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max(1, a.j)) as pool:
        futures = [pool.submit(run_case, c, memtrain, work, a.timeout) for c in cases]
        for c, fu in zip(cases, futures):
            ok, why, took = fu.result()
            print(f"{'ok  ' if ok else 'FAIL'} {c.name} ({took:.1f} s): {why}", flush=True)
            if not ok:
                failed.append(c.name)
    per = {}
    for c in cases:
        cat = c.name.split("/")[0]
        t, f = per.get(cat, (0, 0))
        per[cat] = (t + 1, f + (c.name in failed))
    print("damaged inputs: " + ", ".join(f"{k} {t - f}/{t}" for k, (t, f) in per.items()))
    print(f"damaged inputs: {len(cases) - len(failed)} of {len(cases)} cases pass, "
          f"{len(failed)} fail, {time.monotonic() - start:.0f} s; inputs in {work}")
    if not failed and not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
