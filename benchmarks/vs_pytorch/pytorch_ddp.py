"""The PyTorch side of benchmarks/vs_pytorch: memtrain's models, data order,
loss weighting and optimizer, trained with DistributedDataParallel and
no_sync() on the accumulation micro-steps (gloo on CPU, NCCL on CUDA).

Started once per rank by mpirun (rank and world from Open MPI's variables,
or torchrun's RANK / WORLD_SIZE / LOCAL_RANK), with MASTER_ADDR and
MASTER_PORT set. Standard library + torch + h5py + numpy only.

What is the same as memtrain, and where memtrain defines it:
- parameters: loaded from memtrain's output.dir/initial.safetensors (the
  names are memtrain's, and the modules below register the same ones);
- samples: window w of an epoch is the slice [w*B, (w+1)*B) of one global
  permutation (std::seed_seq + std::mt19937_64 + memtrain's Fisher-Yates,
  src/data/sampling/sharded_sampler.cpp), cut into `world` contiguous rank shares,
  each cut into micro-batches; volume patches are drawn by memtrain's
  counter-based splitmix64 stream (src/data/sampling/patch_sampler.cpp; only
  pos_fraction 0 and flip none are reproduced here);
- loss: each micro-step back-propagates sum(per-sample loss) * world / n,
  n the window's global sample count; DDP's average divides by world, so
  the gradient is memtrain's sum(loss)/n summed over ranks (Note [Window
  weighting]); powers of two scale exactly;
- optimizer: torch.optim.SGD (momentum, weight decay) or AdamW with
  foreach=True, as memtrain's multi-tensor optimizers (Note [Multi-tensor
  optimizers]); no gradient clipping.

Reading: as memtrain's prefetcher reads ahead on a thread of its own, a
DataLoader worker process (--workers 1, the default) reads the micro-batches
of the coming windows with h5py, up to a window ahead (pinned memory on
CUDA); --workers 0 reads on the training thread inside the window.

Timing: time.perf_counter() on rank 0 from the start of a window (before
its first batch is taken) to after optimizer.step() and zero_grad(): what
the worker has not read yet is waited for inside the window, as memtrain's
window_s waits for its reader.
"""

import argparse
import contextlib
import json
import os
import resource
import struct
import sys
import time

import h5py
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

DICE_EPS = 1e-5  # memtrain's kDiceEps (include/memtrain/model/losses.h)
M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF


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


# ------------------------------------------------------------------ models


def groups_for(channels):
    for g in range(8, 1, -1):
        if channels % g == 0:
            return g
    return 1


class MlpBlock(nn.Module):
    def __init__(self, width, norm):
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.norm = nn.GroupNorm(groups_for(4 * width), 4 * width) if norm else None

    def forward(self, x):
        h = self.fc1(x)
        if self.norm is not None:
            h = self.norm(h.float())
        return x + self.fc2(torch.relu(h))


class FeatureMlp(nn.Module):
    def __init__(self, features, hidden, depth, classes, norm):
        super().__init__()
        self.input = nn.Linear(features, hidden)
        self.blocks = nn.ModuleList([MlpBlock(hidden, norm) for _ in range(depth)])
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        x = torch.relu(self.input(x))
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class ConvStage(nn.Module):
    def __init__(self, cin, cout, norm, pool):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = nn.GroupNorm(groups_for(cout), cout) if norm else None
        self.pool = pool

    def forward(self, x):
        h = self.conv(x)
        if self.norm is not None:
            h = self.norm(h.float())
        h = torch.relu(h)
        return F.max_pool2d(h, 2) if self.pool else h


class SmallCnn(nn.Module):
    def __init__(self, shape, width, depth, classes, norm):
        super().__init__()
        self.stem = nn.Conv2d(shape[0], width, 3, padding=1)
        stages, ch, h, w = [], width, shape[1], shape[2]
        for _ in range(depth):
            pool = h >= 2 and w >= 2
            stages.append(ConvStage(ch, 2 * ch, norm, pool))
            ch *= 2
            if pool:
                h, w = h // 2, w // 2
        self.stages = nn.ModuleList(stages)
        self.head = nn.Linear(ch, classes)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for s in self.stages:
            x = s(x)
        return self.head(F.adaptive_avg_pool2d(x, (1, 1)).flatten(1))


def make_norm3d(kind, channels):
    if kind == "instance":
        return nn.InstanceNorm3d(channels, affine=True)
    if kind == "group":
        return nn.GroupNorm(groups_for(channels), channels)
    return None


class ResBlock(nn.Module):
    def __init__(self, cin, cout, norm):
        super().__init__()
        has_norm = norm != "none"
        self.conv1 = nn.Conv3d(cin, cout, 3, padding=1, bias=not has_norm)
        self.norm1 = make_norm3d(norm, cout)
        self.conv2 = nn.Conv3d(cout, cout, 3, padding=1, bias=not has_norm)
        self.norm2 = make_norm3d(norm, cout)
        self.proj = nn.Conv3d(cin, cout, 1) if cin != cout else None

    @staticmethod
    def normed(norm, h):
        return h if norm is None else norm(h.float())

    def forward(self, x):
        h = torch.relu(self.normed(self.norm1, self.conv1(x)))
        h = self.normed(self.norm2, self.conv2(h))
        return torch.relu(h + (self.proj(x) if self.proj is not None else x))


class UNet3d(nn.Module):
    def __init__(self, in_channels, feature_size, depth, classes, norm):
        super().__init__()
        f = feature_size
        self.depth = depth
        self.enc = nn.ModuleList(
            [ResBlock(in_channels if l == 0 else f << (l - 1), f << l, norm) for l in range(depth)]
        )
        self.up = nn.ModuleList(
            [nn.ConvTranspose3d(f << (l + 1), f << l, 2, stride=2) for l in range(depth - 1)]
        )
        self.dec = nn.ModuleList([ResBlock(2 * (f << l), f << l, norm) for l in range(depth - 1)])
        self.head = nn.Conv3d(f, classes, 1)

    def forward(self, x):
        skips = []
        for l in range(self.depth):
            x = self.enc[l](x if l == 0 else F.max_pool3d(x, 2))
            if l + 1 < self.depth:
                skips.append(x)
        for l in range(self.depth - 2, -1, -1):
            x = self.dec[l](torch.cat([self.up[l](x), skips[l]], 1))
        return self.head(x)


def dice_ce_loss_sum(logits, target):
    """memtrain's dice_ce_loss_sum (src/model/losses.cpp), op for op."""
    voxels = [2, 3, 4]
    logp = torch.log_softmax(logits.float(), 1)
    index = target.unsqueeze(1)
    ce = -logp.gather(1, index).mean(voxels).squeeze(1)
    p = logp.exp()
    g = torch.zeros_like(p).scatter_(1, index, 1.0)
    inter = (p * g).sum(voxels)
    dice = (2.0 * inter + DICE_EPS) / (p.sum(voxels) + g.sum(voxels) + DICE_EPS)
    return (ce + (1.0 - dice.mean(1))).sum()


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

    def __init__(self, path, model, patch, patches_per_volume, seed):
        self.f = h5py.File(path, "r")
        self.model = model
        self.seed = seed
        key = {"mlp": "features", "unet3d": "volumes"}.get(model, "images")
        self.x = self.f[key]
        self.y = self.f["masks" if model == "unet3d" else "labels"]
        self.num_classes = int(self.f.attrs["num_classes"])
        integer = np.issubdtype(self.x.dtype, np.integer)
        scale = 1.0 / 255.0 if self.x.dtype == np.uint8 else 1.0
        scale = float(self.x.attrs.get("scale", scale))
        shift = float(self.x.attrs.get("shift", 0.0))
        if model == "mlp":
            self.normalise = False
        elif model != "unet3d":  # the CNN, SE-ResNeXt: images
            self.normalise = integer
        else:
            self.normalise = scale != 1.0 or shift != 0.0
        self.scale, self.shift = np.float32(scale), np.float32(shift)
        if model == "unet3d":
            self.shape = self.x.shape[2:]
            self.patch = patch
            self.num_samples = self.x.shape[0] * patches_per_volume
        else:
            self.num_samples = self.x.shape[0]

    def close(self):
        self.f.close()

    def _norm(self, x):
        x = x.astype(np.float32)
        if self.normalise:
            x = x * self.scale + self.shift
        return x

    def load(self, epoch, ids):
        if self.model != "unet3d":
            rows = sorted(set(ids))
            pos = {r: k for k, r in enumerate(rows)}
            order = [pos[i] for i in ids]
            x = self._norm(self.x[rows])[order]
            y = self.y[rows].astype(np.int64)[order]
            return torch.from_numpy(x), torch.from_numpy(y)
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
            self.data = Data(a.data, a.model, a.patch, a.patches_per_volume, a.data_seed)
        return self.data.load(*self.plan[k])


# -------------------------------------------------------------------- main


def micro_batches(a, plan):
    """The run's micro-batches in order, read ahead by a.workers DataLoader
    processes (up to a window ahead; pinned memory on CUDA)."""
    return iter(
        torch.utils.data.DataLoader(
            MicroBatches(a, plan),
            batch_size=None,
            num_workers=a.workers,
            pin_memory=a.device == "cuda",
            **({"prefetch_factor": max(2, a.accum)} if a.workers > 0 else {}),
        )
    )


def compute_floor(a, model, loss_fn, windows, plan, device, sync):
    """The same windows again, every rank at once, with the bare model:
    forward and backward of each micro-batch, read as in the run, and
    nothing else -- no DDP, no all-reduce, no optimizer step. The time any
    trainer running these kernels on this machine needs for the window's
    compute, per window."""
    batches = micro_batches(a, plan)
    floor_s = []
    dist.barrier()
    for n, steps in windows:
        weight = dist.get_world_size() / n
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            x, y = next(batches)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            (loss_fn(model(x), y) * weight).backward()
        sync()
        floor_s.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return floor_s


def env_int(*names, default=None):
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    if default is None:
        sys.exit(f"pytorch_ddp.py: none of {', '.join(names)} is set; start it under mpirun or torchrun")
    return default


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["mlp", "cnn", "unet3d", "seresnext50_32x4d"], required=True)
    ap.add_argument("--data", required=True, help="training HDF5 file")
    ap.add_argument("--init", required=True, help="memtrain's initial.safetensors")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--feature-size", type=int, default=16)
    ap.add_argument("--norm", default="none")
    ap.add_argument("--patch", type=int, nargs=3, default=[32, 32, 32])
    ap.add_argument("--patches-per-volume", type=int, default=8)
    ap.add_argument("--micro", type=int, required=True, help="micro-batch per rank")
    ap.add_argument("--accum", type=int, required=True, help="micro-steps per window")
    ap.add_argument("--windows", type=int, required=True)
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--threads", type=int, required=True, help="intra-op threads per rank")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--bucket-mib", type=float, default=25.0)
    ap.add_argument("--workers", type=int, default=1, help="DataLoader reader processes (0: read in the window)")
    ap.add_argument("--out", required=True, help="results JSON (rank 0)")
    ap.add_argument("--save", default="", help="final parameters, safetensors (rank 0)")
    ap.add_argument(
        "--compute-floor",
        action="store_true",
        help="after the run, time the same windows' forward and backward alone (no DDP, no step)",
    )
    a = ap.parse_args()

    rank = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK")
    world = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE")
    local = env_int("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", default=0)
    torch.set_num_threads(a.threads)
    if a.device == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world)

    data = Data(a.data, a.model, a.patch, a.patches_per_volume, a.data_seed)
    init = load_safetensors(a.init)
    if a.model == "mlp":
        model = FeatureMlp(data.x.shape[1], a.hidden, a.depth, data.num_classes, a.norm == "group")
        loss_fn = lambda z, y: F.cross_entropy(z, y, reduction="sum")
    elif a.model == "cnn":
        model = SmallCnn(data.x.shape[1:], a.hidden, a.depth, data.num_classes, a.norm == "group")
        loss_fn = lambda z, y: F.cross_entropy(z, y, reduction="sum")
    elif a.model == "seresnext50_32x4d":
        # timm's own model: memtrain's parameter names are timm's.
        import timm

        model = timm.create_model(a.model, num_classes=data.num_classes, pretrained=False)
        loss_fn = lambda z, y: F.cross_entropy(z, y, reduction="sum")
    else:
        model = UNet3d(data.x.shape[1], a.feature_size, a.depth, data.num_classes, a.norm)
        loss_fn = dice_ce_loss_sum
    # Parameters and buffers (batch-norm's running statistics).
    mine = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    if sorted(mine) != sorted(init):
        sys.exit(
            f"pytorch_ddp.py: {a.init} holds {sorted(set(init) - set(mine))} not in the model "
            f"and lacks {sorted(set(mine) - set(init))}: the model sizes do not match memtrain's"
        )
    with torch.no_grad():
        for k, p in mine.items():
            if tuple(p.shape) != tuple(init[k].shape):
                sys.exit(f"pytorch_ddp.py: {k}: shape {tuple(p.shape)} here, {tuple(init[k].shape)} in {a.init}")
            p.copy_(init[k])
    model.to(device).train()
    ddp = nn.parallel.DistributedDataParallel(
        model,
        device_ids=[local] if a.device == "cuda" else None,
        bucket_cap_mb=a.bucket_mib,
        gradient_as_bucket_view=True,
    )
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(
            model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay, foreach=True
        )
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay, foreach=True)

    B = world * a.accum * a.micro
    if data.num_samples < B:
        sys.exit(f"pytorch_ddp.py: {a.data} has {data.num_samples} samples, fewer than one window of {B}")
    per_epoch = (data.num_samples + B - 1) // B
    num_samples = data.num_samples
    data.close()
    # This rank's micro-batches of every window, in order, and the window's
    # global sample count.
    windows, plan = [], []
    perms = {}
    for step in range(a.windows):
        epoch, w = divmod(step, per_epoch)
        if epoch not in perms:
            perms = {epoch: permutation(num_samples, a.data_seed, epoch)}
        ids = perms[epoch][w * B : min((w + 1) * B, num_samples)]
        n = len(ids)
        share = ids[n * rank // world : n * (rank + 1) // world]
        micro = [share[s : s + a.micro] for s in range(0, len(share), a.micro)]
        windows.append((n, len(micro)))
        plan += [(epoch, mb) for mb in micro]
    batches = micro_batches(a, plan)
    window_s, local_loss = [], []
    sync = (lambda: torch.cuda.synchronize()) if a.device == "cuda" else (lambda: None)
    for n, steps in windows:
        weight = world / n  # DDP divides by world: Note [Window weighting]
        sync()
        t0 = time.perf_counter()
        loss_sum = 0.0
        for k in range(steps):
            ctx = ddp.no_sync() if k + 1 < steps else contextlib.nullcontext()
            with ctx:
                x, y = next(batches)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = loss_fn(ddp(x), y)
                (loss * weight).backward()
                loss_sum += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        window_s.append(time.perf_counter() - t0)
        local_loss.append(loss_sum)

    # Losses and memory gathered once, after the timed windows (on the
    # device: NCCL reduces CUDA tensors only).
    losses = torch.tensor(local_loss, dtype=torch.float64, device=device)
    dist.all_reduce(losses)
    losses = losses.cpu()
    peak = torch.cuda.max_memory_allocated(device) if a.device == "cuda" else 0
    mem = torch.tensor(
        [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, peak], dtype=torch.float64, device=device
    )
    dist.all_reduce(mem, op=dist.ReduceOp.MAX)
    rss, peak = mem[0].cpu(), int(mem[1].item())
    if a.save and rank == 0:
        save_safetensors(a.save, dict(model.named_parameters()), {"format": "pt", "producer": "pytorch_ddp.py"})
    # After the run's figures and final parameters (it steps nothing).
    floor_s = compute_floor(a, model, loss_fn, windows, plan, device, sync) if a.compute_floor else None
    if rank == 0:
        n_of = lambda s: min(B, num_samples - (s % per_epoch) * B)
        res = {
            "side": "pytorch",
            "torch": torch.__version__,
            "backend": backend,
            "threads": torch.get_num_threads(),
            "world": world,
            "effective_batch": B,
            "window_s": window_s,
            "loss": [float(losses[s]) / n_of(s) for s in range(a.windows)],
            "peak_rss_bytes": int(rss.item()),
            "peak_allocated_bytes": peak,
        }
        if floor_s is not None:
            res["compute_floor_s"] = floor_s
        with open(a.out + ".tmp", "w") as f:
            json.dump(res, f)
        os.replace(a.out + ".tmp", a.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
