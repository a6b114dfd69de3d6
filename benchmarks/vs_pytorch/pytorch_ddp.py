"""The PyTorch side of benchmarks/vs_pytorch: memtrain's models, data order,
loss weighting and optimizer, trained with DistributedDataParallel and
no_sync() on the accumulation micro-steps (gloo on CPU, NCCL on CUDA).

Started once per rank by mpirun (rank and world from Open MPI's variables,
or torchrun's RANK / WORLD_SIZE / LOCAL_RANK), meeting through --rendezvous
(a file: no port to pick) or MASTER_ADDR and MASTER_PORT. Standard library + torch + h5py + numpy, and the peer's
framework for its model: timm (seresnext50_32x4d; fsct's ResNet-50), MONAI
(swin_unetr), open_clip (clip).

What is the same as memtrain, and where memtrain defines it:
- models (race_models.py): memtrain's MLP, CNN and U-Net written module for
  module; timm's, MONAI's and open_clip's own for the seeds' models; FS-CT
  as its official code lays it out, on timm's ResNet-50;
- parameters: loaded from memtrain's output.dir/initial.safetensors (the
  names are memtrain's, and the modules register the same ones, or map
  theirs: FS-CT's memtrain_name);
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
  CLIP's loss is open_clip's ClipLoss of the world's batch (race_models.
  ClipStep), one micro-step a window: memtrain's exact contrastive loss;
  its logit scale is clamped to [0, log 100] after each step, as both do;
  FS-CT's sample is an episode (race_data.episode_rows, memtrain's rule),
  its loss each episode's mean query cross-entropy;
- optimizer: torch.optim.SGD (momentum, weight decay) or AdamW with
  foreach=True, as memtrain's multi-tensor optimizers (Note [Multi-tensor
  optimizers]); --grad-clip: the global norm clipped as memtrain's
  training.grad_clip_norm (torch.nn.utils.clip_grad_norm_).

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
import faulthandler
import json
import math
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import race_models as rm
from race_data import Data, MicroBatches, load_safetensors, permutation, save_safetensors


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


def compute_floor(a, model, step, windows, plan, device, sync):
    """The same windows again, every rank at once, with the bare model:
    forward and backward of each micro-batch, read as in the run, and
    nothing else -- no DDP, no gradient all-reduce, no optimizer step (CLIP's
    loss keeps its all-gather of the embeddings and that one's backward:
    the loss needs them). The time any trainer running these kernels on
    this machine needs for the window's compute, per window."""
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
            step(model, x, y, weight)[0].backward()
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


def build(a, data, rank, world):
    """The model of a.model and its step: step(model, x, y, weight) gives
    what to back-propagate and the micro-batch's loss summed over its
    samples (memtrain's loss record)."""
    ce = lambda z, y: F.cross_entropy(z, y, reduction="sum")
    if a.model == "mlp":
        model, loss_fn = rm.FeatureMlp(data.x.shape[1], a.hidden, a.depth, data.num_classes, a.norm == "group"), ce
    elif a.model == "cnn":
        model, loss_fn = rm.SmallCnn(data.x.shape[1:], a.hidden, a.depth, data.num_classes, a.norm == "group"), ce
    elif a.model == "seresnext50_32x4d":
        # timm's own model: memtrain's parameter names are timm's.
        import timm

        model, loss_fn = timm.create_model(a.model, num_classes=data.num_classes, pretrained=False), ce
    elif a.model == "unet3d":
        model = rm.UNet3d(data.x.shape[1], a.feature_size, a.depth, data.num_classes, a.norm)
        loss_fn = rm.dice_ce_loss_sum
    elif a.model == "swin_unetr":
        model, loss_fn = rm.swin_unetr(data.x.shape[1], data.num_classes, a.feature_size), rm.dice_ce_loss_sum
    elif a.model == "fsct":
        n, k, q = a.episodes[:3]
        model, loss_fn = rm.FewShotTransformer(data.x.shape[1], a.embed_dim, n, k, q), rm.episode_loss_sum
    else:  # clip: the window's one contrastive batch (weight unused: DDP's mean is the batch's)
        model, clip = rm.open_clip_model(a.variant, data.x.shape[-1]), rm.ClipStep(rank, world)

        def clip_step(m, x, y, weight):
            loss, rows = clip(m, x, y)
            return loss, loss.detach() * rows

        return model, clip_step

    def step(m, x, y, weight):
        loss = loss_fn(m(x), y)
        return loss * weight, loss.detach()

    return model, step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model", choices=["mlp", "cnn", "unet3d", "seresnext50_32x4d", "swin_unetr", "clip", "fsct"], required=True
    )
    ap.add_argument("--variant", default="ViT-B-32", help="clip: open_clip's model name")
    ap.add_argument("--data", required=True, help="training HDF5 file")
    ap.add_argument("--init", required=True, help="memtrain's initial.safetensors")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--feature-size", type=int, default=16)
    ap.add_argument("--norm", default="none")
    ap.add_argument("--patch", type=int, nargs=3, default=[32, 32, 32])
    ap.add_argument("--patches-per-volume", type=int, default=8)
    ap.add_argument(
        "--episodes",
        type=int,
        nargs=4,
        metavar=("N", "K", "Q", "PER_EPOCH"),
        help="fsct: n_way, k_shot, n_query and episodes per epoch (data.episodes.*)",
    )
    ap.add_argument("--val-classes", type=float, default=0.2, help="fsct: data.val_classes, a fraction")
    ap.add_argument("--embed-dim", type=int, default=512, help="fsct: model.embed_dim")
    ap.add_argument(
        "--rendezvous",
        help="a file that does not exist yet, on a file system every rank sees: the ranks meet through "
        "torch.distributed's FileStore on it (default: MASTER_ADDR and MASTER_PORT)",
    )
    ap.add_argument(
        "--stacks-after",
        type=float,
        default=0,
        help="seconds: if the run is still going then, every thread's Python stack to stderr, once (a hang's "
        "where; 0: never)",
    )
    ap.add_argument("--micro", type=int, required=True, help="micro-batch per rank")
    ap.add_argument("--accum", type=int, required=True, help="micro-steps per window")
    ap.add_argument("--windows", type=int, required=True)
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--grad-clip", type=float, default=0.0, help="global gradient norm (0: none)")
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
    if (a.model == "fsct") != (a.episodes is not None):
        sys.exit("pytorch_ddp.py: --episodes goes with --model fsct, and fsct needs it")
    a.episodes = (*a.episodes, a.val_classes) if a.episodes else None
    if a.stacks_after > 0:
        faulthandler.dump_traceback_later(a.stacks_after, exit=False)

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
    meet = {"init_method": "file://" + os.path.abspath(a.rendezvous)} if a.rendezvous else {}
    dist.init_process_group(backend, rank=rank, world_size=world, **meet)

    data = Data(a.data, a.model, a.patch, a.patches_per_volume, a.data_seed, a.episodes)
    init = load_safetensors(a.init)
    if a.model == "clip" and a.accum != 1:
        sys.exit("pytorch_ddp.py: clip races one micro-step a window (--accum 1): open_clip's ClipLoss is the window's")
    model, step_fn = build(a, data, rank, world)
    # Parameters and persistent buffers (batch-norm's running statistics,
    # SwinUNETR's relative position index; not CLIP's causal mask), by
    # memtrain's names.
    name_of = getattr(model, "memtrain_name", lambda name: name)
    mine = {name_of(k): v for k, v in model.state_dict(keep_vars=True).items()}
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
        if a.model == "clip" and n % world:
            sys.exit(f"pytorch_ddp.py: window {step + 1} has {n} pairs, not a multiple of {world} ranks: "
                     "open_clip's ClipLoss needs equal rows per rank (choose --windows within an epoch)")
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
                objective, loss = step_fn(ddp, x, y, weight)
                objective.backward()
                loss_sum += loss.item()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip, foreach=True)
        opt.step()
        if a.model == "clip":
            with torch.no_grad():
                model.logit_scale.clamp_(0, math.log(100))
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
        params = {name_of(k): p for k, p in model.named_parameters()}
        save_safetensors(a.save, params, {"format": "pt", "producer": "pytorch_ddp.py"})
    # After the run's figures and final parameters (it steps nothing).
    floor_s = compute_floor(a, model, step_fn, windows, plan, device, sync) if a.compute_floor else None
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
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
