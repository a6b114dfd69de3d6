"""An independent PyTorch reference for memtrain's exact contrastive window.

Builds memtrain's dual encoder in PyTorch from the initial parameters
memtrain wrote (output.save_initial): two feature MLPs (relu(input(x)),
residual blocks x + fc2(relu(fc1(x))), head), L2-normalised, and CLIP's
symmetric InfoNCE with logit scale exp(t), rows of the same /pair_ids
left out of each other's softmax. With the effective batch = all N rows of
the file, memtrain's first window is one contrastive batch of every row
(in some order; the loss does not depend on it), so

  loss = mean_i (CE(L[i, :], i) + CE(L[:, i], i)) / 2,  L = exp(t) A B^T

and the first SGD step (momentum's buffer starts as the gradient) is
p - lr * grad, then t clamped to [0, log 100]. Computed in float64.

usage: contrastive_reference.py DATA.h5 INITIAL.safetensors DEPTH LR
         [MODEL.safetensors]
  prints the loss; with MODEL (memtrain's weights after that window), also
  the largest |memtrain - reference| over all parameters.
"""

import math
import sys
from pathlib import Path

import h5py
import torch
import torch.nn.functional as F


def load_safetensors(path):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import safetensors_read

    tensors, _ = safetensors_read.load(path)
    return {
        k: torch.tensor(v, dtype=torch.float64).reshape(shape)
        for k, (_, shape, v) in tensors.items()
    }


def tower(p, prefix, x, depth):
    lin = lambda h, k: F.linear(h, p[f"{prefix}.{k}.weight"], p[f"{prefix}.{k}.bias"])
    h = torch.relu(lin(x, "input"))
    for i in range(depth):
        h = h + lin(torch.relu(lin(h, f"blocks.{i}.fc1")), f"blocks.{i}.fc2")
    return F.normalize(lin(h, "head"), dim=1)


def main():
    data, init, depth, lr = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    with h5py.File(data, "r") as f:
        xa = torch.tensor(f["features_a"][...], dtype=torch.float64)
        xb = torch.tensor(f["features_b"][...], dtype=torch.float64)
        ids = (
            torch.tensor(f["pair_ids"][...].astype("int64"))
            if "pair_ids" in f
            else torch.arange(xa.shape[0])
        )
    p = load_safetensors(init)
    for v in p.values():
        v.requires_grad_(True)
    a = tower(p, "tower_a", xa, depth)
    b = tower(p, "tower_b", xb, depth)
    logits = p["logit_scale"].exp() * a @ b.T
    n = xa.shape[0]
    same = (ids[:, None] == ids[None, :]) & ~torch.eye(n, dtype=torch.bool)
    logits = logits.masked_fill(same, float("-inf"))
    target = torch.arange(n)
    loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    loss.backward()
    print(f"{loss.item():.10f}")
    if len(sys.argv) > 5:
        got = load_safetensors(sys.argv[5])
        worst = 0.0
        with torch.no_grad():
            for k, v in p.items():
                new = v - lr * v.grad
                if k == "logit_scale":
                    new = new.clamp(0.0, math.log(100.0))
                worst = max(worst, (got[k] - new).abs().max().item())
        print(f"{worst:.3e}")


if __name__ == "__main__":
    main()
