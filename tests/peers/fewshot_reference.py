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
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "vs_pytorch"))
from race_data import class_rows, episode_rows, training_classes  # noqa: E402


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
    """The features of DATA, each class's rows and the training classes
    (race_data: the split of Note [Episodes])."""
    with h5py.File(data, "r") as f:
        x_all = torch.tensor(f["features"][...])
        labels = f["labels"][...]
        num_classes = int(f.attrs.get("num_classes", 0))
    rows = class_rows(labels, num_classes)
    return x_all, rows, training_classes(len(rows), seed, fraction)


def draw_episode(x_all, rows, train, n, k, q, seed, i):
    """Training episode i of epoch 0: the support (n k, F), the queries
    (n q, F) and their targets."""
    picked = episode_rows(rows, train, n, k, q, seed, 0, i)
    support = torch.stack([x_all[r] for r in picked[: n * k]])
    query = torch.stack([x_all[r] for r in picked[n * k :]])
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
