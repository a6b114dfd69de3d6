"""An independent PyTorch reference for memtrain's few-shot loss.

Re-draws episodes by the rule documented in src/data/sampling/episodes.cpp (Note
[Episodes]), builds memtrain's feature MLP in PyTorch from the initial
parameters memtrain wrote (output.save_initial), and computes the mean
query cross-entropy of episodes 0..E-1 of epoch 0 with the prototype or
cosine head written out here. With data.episodes.per_epoch = E = the
effective batch, memtrain's first window holds exactly those episodes, so
its logged window loss must equal this mean.

usage: fewshot_reference.py DATA.h5 INITIAL.safetensors HEAD N K Q E SEED
       VAL_FRACTION DEPTH    -> prints the mean loss
"""

import sys
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.nn.functional as F

M64 = (1 << 64) - 1
G = 0x9E3779B97F4A7C15


def mix(z):
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class Rng:
    def __init__(self, seed, stream, epoch, index):
        h = mix(seed + G)
        h = mix(h + stream + G)
        h = mix(h + epoch + G)
        self.state = mix(h + index + G)

    def next(self):
        self.state = (self.state + G) & M64
        return mix(self.state)

    def below(self, n):
        limit = M64 - (M64 % n)
        while True:
            r = self.next()
            if r < limit:
                return r % n


def draw_distinct(items, m, rng):
    items = list(items)
    for i in range(m):
        j = i + rng.below(len(items) - i)
        items[i], items[j] = items[j], items[i]
    return items[:m]


def load_safetensors(path):
    """The parameters, read by the tests' independent safetensors reader."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import safetensors_read

    tensors, _ = safetensors_read.load(path)
    return {k: torch.tensor(v).reshape(shape) for k, (_, shape, v) in tensors.items()}


def mlp_embed(p, x, depth):
    """memtrain's FeatureMlp (no norm, no dropout) under the few-shot head:
    relu(input(x)), residual blocks x + fc2(relu(fc1(x))), head."""
    lin = lambda h, k: F.linear(h, p[f"backbone.{k}.weight"], p[f"backbone.{k}.bias"])
    h = torch.relu(lin(x, "input"))
    for i in range(depth):
        h = h + lin(torch.relu(lin(h, f"blocks.{i}.fc1")), f"blocks.{i}.fc2")
    return lin(h, "head")


def read_split(data, seed, fraction):
    """The features of DATA, each class's rows and the training classes:
    the class split draws from stream 2 and holds out the first
    max(1, round(fraction * C))."""
    with h5py.File(data, "r") as f:
        x_all = torch.tensor(f["features"][...])
        labels = f["labels"][...]
    classes = int(labels.max()) + 1
    rows = [sorted(np.nonzero(labels == c)[0].tolist()) for c in range(classes)]
    perm = draw_distinct(range(classes), classes, Rng(seed, 2, 0, 0))
    held = set(perm[: max(1, int(round(fraction * classes)))])
    return x_all, rows, [c for c in range(classes) if c not in held]


def draw_episode(x_all, rows, train, n, k, q, seed, i):
    """Training episode i (stream 0): n classes of `train`, k + q rows of
    each; the support (n k, F), the queries (n q, F) and their targets."""
    rng = Rng(seed, 0, 0, i)
    chosen = draw_distinct(train, n, rng)
    picks = [draw_distinct(rows[c], k + q, rng) for c in chosen]
    support = torch.stack([x_all[r] for pk in picks for r in pk[:k]])
    query = torch.stack([x_all[r] for pk in picks for r in pk[k:]])
    return support, query, torch.arange(n).repeat_interleave(q)


def main():
    data, init, head = sys.argv[1], sys.argv[2], sys.argv[3]
    n, k, q, e, seed = map(int, sys.argv[4:9])
    fraction, depth = float(sys.argv[9]), int(sys.argv[10])
    x_all, rows, train = read_split(data, seed, fraction)
    p = load_safetensors(init)
    losses = []
    for i in range(e):
        support, query, target = draw_episode(x_all, rows, train, n, k, q, seed, i)
        s = mlp_embed(p, support, depth).reshape(n, k, -1).mean(1)
        qe = mlp_embed(p, query, depth)
        if head == "prototype":
            logits = -torch.cdist(qe.double(), s.double()).pow(2)
        else:
            logits = p["scale"].double() * (
                F.normalize(qe.double(), dim=1) @ F.normalize(s.double(), dim=1).T
            )
        losses.append(F.cross_entropy(logits, target).item())
    print(f"{sum(losses) / len(losses):.8f}")


if __name__ == "__main__":
    main()
