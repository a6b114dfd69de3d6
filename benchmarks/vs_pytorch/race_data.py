"""memtrain's sample order and data, read in Python for benchmarks/vs_pytorch
(pytorch_ddp.py) and the peer tests (tests/peers): the global permutation
of a window's samples (std::seed_seq + std::mt19937_64 + memtrain's
Fisher-Yates, src/data/sampling/sharded_sampler.cpp), the volumes' patch
corners (splitmix64, src/data/sampling/patch_sampler.cpp; pos_fraction 0
and flip none only), the few-shot episodes' classes and rows (SplitMix64
streams, src/data/sampling/episodes.cpp, Note [Episodes]), memtrain's HDF5
layouts (docs/data-format.md) with h5py, and safetensors files. Standard
library + torch + h5py + numpy."""

import json
import math
import os
import struct

import h5py
import numpy as np
import torch

M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF
VOLUME_MODELS = ("unet3d", "swin_unetr")  # patches of /volumes, /masks
# OpenAI's image mean and std (memtrain's data.normalize clip), per channel.
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32).reshape(3, 1, 1)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32).reshape(3, 1, 1)

# ---------------------------------------------------------------- sampling


def seed_seq_generate(seeds, n):
    """std::seed_seq::generate (C++11 [rand.util.seedseq]) of n words."""
    s = len(seeds)
    b = [0x8B8B8B8B] * n
    t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
    p = (n - t) // 2
    q = p + t
    m = max(s + 1, n)

    def T(x):
        return x ^ (x >> 27)

    for k in range(m):
        r1 = (1664525 * T(b[k % n] ^ b[(k + p) % n] ^ b[(k - 1) % n])) & M32
        if k == 0:
            r2 = r1 + s
        elif k <= s:
            r2 = r1 + k % n + seeds[k - 1]
        else:
            r2 = r1 + k % n
        r2 &= M32
        b[(k + p) % n] = (b[(k + p) % n] + r1) & M32
        b[(k + q) % n] = (b[(k + q) % n] + r2) & M32
        b[k % n] = r2
    for k in range(m, m + n):
        r3 = (1566083941 * T((b[k % n] + b[(k + p) % n] + b[(k - 1) % n]) & M32)) & M32
        r4 = (r3 - k % n) & M32
        b[(k + p) % n] ^= r3
        b[(k + q) % n] ^= r4
        b[k % n] = r4
    return b


class MT19937_64:
    """std::mt19937_64 seeded from a std::seed_seq."""

    N, M = 312, 156
    UPPER, LOWER = 0xFFFFFFFF80000000, 0x7FFFFFFF

    def __init__(self, seeds):
        w = seed_seq_generate(seeds, 2 * self.N)
        self.x = [w[2 * i] | (w[2 * i + 1] << 32) for i in range(self.N)]
        if all(v == 0 for v in self.x[1:]) and (self.x[0] & self.UPPER) == 0:
            self.x[0] = 1 << 63
        self.i = self.N

    def __call__(self):
        if self.i >= self.N:
            x = self.x
            for k in range(self.N):
                y = (x[k] & self.UPPER) | (x[(k + 1) % self.N] & self.LOWER)
                v = x[(k + self.M) % self.N] ^ (y >> 1)
                if y & 1:
                    v ^= 0xB5026F5AA96619E9
                x[k] = v
            self.i = 0
        y = self.x[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & M64


def permutation(num_samples, seed, epoch):
    """memtrain's ShardedSampler::ensure_epoch."""
    perm = list(range(num_samples))
    rng = MT19937_64([seed & M32, (seed >> 32) & M32, epoch & M32, (epoch >> 32) & M32])
    for i in range(num_samples - 1, 0, -1):
        bound = i + 1
        limit = M64 - (M64 % bound)
        while True:
            r = rng()
            if r < limit:
                break
        j = r % bound
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def patch_corner(seed, epoch, sample, shape, patch):
    """memtrain's PatchSampler::at with pos_fraction 0 and flip none."""
    key = splitmix64(
        splitmix64(seed ^ 0x5851F42D4C957F2D)
        ^ splitmix64((epoch * 0x2545F4914F6CDD1D + sample) & M64)
    )

    def below(k, n):
        if n <= 1:
            return 0
        return splitmix64(key ^ splitmix64((k + 0x632BE59BD9B4E019) & M64)) % n

    return [below(2 + i, shape[i] - patch[i] + 1) for i in range(3)]


class EpisodeRng:
    """The SplitMix64 stream of (seed, stream, epoch, index) of
    src/data/sampling/episodes.cpp: stream 0 training episodes, 1
    validation, 2 the class split."""

    G = 0x9E3779B97F4A7C15

    def __init__(self, seed, stream, epoch, index):
        h = _mix(seed + self.G)
        h = _mix(h + stream + self.G)
        h = _mix(h + epoch + self.G)
        self.state = _mix(h + index + self.G)

    def next(self):
        self.state = (self.state + self.G) & M64
        return _mix(self.state)

    def below(self, n):
        limit = M64 - (M64 % n)
        while True:
            r = self.next()
            if r < limit:
                return r % n


def _mix(z):
    """SplitMix64's finaliser (splitmix64 without its increment)."""
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def draw_distinct(items, m, rng):
    """The first m of a partial Fisher-Yates shuffle of items by rng."""
    items = list(items)
    for i in range(m):
        j = i + rng.below(len(items) - i)
        items[i], items[j] = items[j], items[i]
    return items[:m]


def class_rows(labels, num_classes=0):
    """Each class's rows, ascending: classes 0..C-1, C the file's
    num_classes attribute where it has one (memtrain's rule), otherwise the
    largest label + 1."""
    labels = np.asarray(labels)
    classes = num_classes or int(labels.max()) + 1
    return [sorted(np.nonzero(labels == c)[0].tolist()) for c in range(classes)]


def training_classes(num_classes, seed, fraction):
    """data.val_classes as a fraction: the class split draws from stream 2
    and holds out the first max(1, llround(fraction * C)) (halves away from
    zero, as C++'s llround; Python's round() takes them to even); the rest,
    ascending."""
    perm = draw_distinct(range(num_classes), num_classes, EpisodeRng(seed, 2, 0, 0))
    held = set(perm[: max(1, int(math.floor(fraction * num_classes + 0.5)))])
    return [c for c in range(num_classes) if c not in held]


def episode_rows(rows, train, n, k, q, seed, epoch, i):
    """Training episode (epoch, i), stream 0: n classes of `train`, k + q
    rows of each; the support's rows class-major, then the queries'."""
    rng = EpisodeRng(seed, 0, epoch, i)
    chosen = draw_distinct(train, n, rng)
    picks = [draw_distinct(rows[c], k + q, rng) for c in chosen]
    return [r for pk in picks for r in pk[:k]] + [r for pk in picks for r in pk[k:]]


# ------------------------------------------------------------- safetensors

_DT = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def load_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        a = np.frombuffer(blob, dtype=np.dtype(_DT[e["dtype"]]).newbyteorder("<"), count=(end - b) // np.dtype(_DT[e["dtype"]]).itemsize, offset=8 + n + b)
        out[name] = torch.from_numpy(a.reshape(e["shape"]).astype(_DT[e["dtype"]]))
    return out


def save_safetensors(path, tensors, metadata):
    header, offset, chunks = {"__metadata__": metadata}, 0, []
    for name, t in tensors.items():
        code, dt = ("I64", "<i8") if t.dtype == torch.int64 else ("F32", "<f4")
        a = t.detach().cpu().contiguous().numpy().astype(dt)
        data = a.tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    h = json.dumps(header).encode("utf-8")
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


# -------------------------------------------------------------------- data


class Data:
    """Reads memtrain's HDF5 layout (docs/data-format.md) with h5py."""

    def __init__(self, path, model, patch, patches_per_volume, seed, episodes=None):
        """episodes (fsct): (n_way, k_shot, n_query, per_epoch, val_fraction);
        a sample is then an episode of /images, its rows drawn as memtrain's."""
        self.f = h5py.File(path, "r")
        self.model = model
        self.seed = seed
        self.volumes = model in VOLUME_MODELS
        self.episodes = episodes
        key = "features" if model == "mlp" else "volumes" if self.volumes else "images"
        self.x = self.f[key]
        self.y = self.f["masks" if self.volumes else "tokens" if model == "clip" else "labels"]
        self.num_classes = int(self.f.attrs.get("num_classes", 0))
        integer = np.issubdtype(self.x.dtype, np.integer)
        scale = 1.0 / 255.0 if self.x.dtype == np.uint8 else 1.0
        scale = float(self.x.attrs.get("scale", scale))
        shift = float(self.x.attrs.get("shift", 0.0))
        if model == "mlp":
            self.normalise = False
        elif not self.volumes:  # images: the CNN, SE-ResNeXt, CLIP, FS-CT
            self.normalise = integer
        else:
            self.normalise = scale != 1.0 or shift != 0.0
        self.scale, self.shift = np.float32(scale), np.float32(shift)
        if self.volumes:
            self.shape = self.x.shape[2:]
            self.patch = patch
            self.num_samples = self.x.shape[0] * patches_per_volume
        elif episodes:
            self.rows = class_rows(self.y[...], self.num_classes)
            self.train = training_classes(len(self.rows), seed, episodes[4])
            self.num_samples = episodes[3]
        else:
            self.num_samples = self.x.shape[0]

    def close(self):
        self.f.close()

    def _norm(self, x):
        x = x.astype(np.float32)
        if self.normalise:
            x = x * self.scale + self.shift
        if self.model == "clip":  # data.normalize auto: OpenAI's mean and std
            x = (x - CLIP_MEAN) / CLIP_STD
        return x

    def _rows(self, ids):
        """Rows `ids` of /images or /features (any order, repeats allowed)."""
        rows = sorted(set(ids))
        pos = {r: k for k, r in enumerate(rows)}
        order = [pos[i] for i in ids]
        x = self._norm(self.x[rows])[order]
        y = self.y[rows].astype(np.int64)[order]
        return torch.from_numpy(x), torch.from_numpy(y)

    def load(self, epoch, ids):
        if self.episodes:
            # Episodes `ids` of the epoch: their images one after another,
            # and each episode's query targets (n q), class-major.
            n, k, q = self.episodes[:3]
            rows = [r for i in ids for r in episode_rows(self.rows, self.train, n, k, q, self.seed, epoch, i)]
            x, _ = self._rows(rows)
            return x, torch.arange(n).repeat_interleave(q).repeat(len(ids), 1)
        if not self.volumes:
            return self._rows(ids)
        xs, ys = [], []
        nvol = self.x.shape[0]
        p = self.patch
        for i in ids:
            c = patch_corner(self.seed, epoch, i, self.shape, p)
            v = i % nvol
            sl = (slice(c[0], c[0] + p[0]), slice(c[1], c[1] + p[1]), slice(c[2], c[2] + p[2]))
            xs.append(self._norm(self.x[(v, slice(None)) + sl]))
            ys.append(self.y[(v,) + sl].astype(np.int64))
        return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


class MicroBatches(torch.utils.data.Dataset):
    """Item k: the k-th micro-batch (epoch, ids) of the run, read from the
    HDF5 file opened in the process that reads it (a DataLoader worker opens
    its own: h5py files do not cross a fork)."""

    def __init__(self, args, plan):
        self.args, self.plan, self.data = args, plan, None

    def __len__(self):
        return len(self.plan)

    def __getitem__(self, k):
        if self.data is None:
            a = self.args
            self.data = Data(a.data, a.model, a.patch, a.patches_per_volume, a.data_seed, a.episodes)
        return self.data.load(*self.plan[k])
