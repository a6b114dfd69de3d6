"""An independent PyTorch reference for memtrain's few-shot cosine
transformer head (model.head: cosine_transformer; ARCHITECTURE.md, Note [The
few-shot cosine transformer]).

The head (benchmarks/vs_pytorch/race_models.py's FsctHead, which the race
trains too) is written as the official FS-CT code lays it out (Nguyen et
al., IEEE Access 2023; github.com/vinuni-vishc/Few-Shot-Cosine-Transformer,
methods/transformer.py, variant "cosine"), one episode at a time:
prototypes (1, N, D) as the attention's queries, the query embeddings
(Q, 1, D) as its keys and values, cos(f_q, f_k) = f_q f_k^T / (|f_q| |f_k|)
per head, no softmax, no scale; one Attention and one FFN applied `depth`
times; a final LayerNorm, Linear and a cosine linear layer under weight
normalisation with scale 2, whose input the official CosineDistLinear
divides by torch.norm(x, dim=1) + 1e-5 on the (Q, N, d) tensor: the norm
over the classes, for each query and feature.

It re-draws episodes 0..E-1 of epoch 0 by the documented rule (the helpers
of fewshot_reference.py), embeds them with memtrain's feature MLP from
initial.safetensors, takes the mean query cross-entropy, and makes one SGD
step (momentum 0, lr LR) on every parameter. With data.episodes.per_epoch =
E = the effective batch, memtrain's first window is exactly that.

usage: fsct_reference.py DATA.h5 INITIAL.safetensors FINAL.safetensors
       N K Q E SEED VAL_FRACTION MLP_DEPTH LR HEADS DIM_HEAD MLP_DIM DEPTH
       -> prints "LOSS MAX_WEIGHT_DIFFERENCE" (vs FINAL, after the step)
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fewshot_reference import draw_episode, load_safetensors, mlp_embed, read_split  # noqa: E402
from race_models import FsctHead as FSCT  # noqa: E402 (fewshot_reference puts its folder on the path)


def main():
    data, init, final = sys.argv[1:4]
    n, k, q, e, seed = map(int, sys.argv[4:9])
    fraction, mlp_depth, lr = float(sys.argv[9]), int(sys.argv[10]), float(sys.argv[11])
    heads, dim_head, mlp_dim, depth = map(int, sys.argv[12:16])
    torch.set_default_dtype(torch.float64)
    x_all, rows, train = read_split(data, seed, fraction)
    x_all = x_all.double()

    p0 = load_safetensors(init)
    backbone = {name: t.double().requires_grad_() for name, t in p0.items() if name.startswith("backbone.")}
    dim = backbone["backbone.head.weight"].shape[0]
    head = FSCT(dim, n, k, heads, dim_head, mlp_dim, depth)
    own = dict(head.named_parameters())
    mine = {m: t for m, t in p0.items() if m.startswith("fsct.")}
    assert len(mine) == len(own), (sorted(mine), sorted(own))
    with torch.no_grad():
        for m, t in mine.items():
            dst = own[FSCT.NAMES[m[len("fsct.") :]]]
            dst.copy_(t.double().reshape(dst.shape))

    total = 0.0
    for i in range(e):
        support, query, target = draw_episode(x_all, rows, train, n, k, q, seed, i)
        zs = mlp_embed(backbone, support, mlp_depth).reshape(n, k, -1)
        zq = mlp_embed(backbone, query, mlp_depth)
        total = total + F.cross_entropy(head(zs, zq), target)
    loss = total / e
    loss.backward()

    after = load_safetensors(final)
    worst = 0.0
    with torch.no_grad():
        for name, t in backbone.items():
            worst = max(worst, (t - lr * t.grad - after[name].double()).abs().max().item())
        for m in mine:
            t = own[FSCT.NAMES[m[len("fsct.") :]]]
            new = (t - lr * t.grad).reshape(after[m].shape)
            worst = max(worst, (new - after[m].double()).abs().max().item())
    print(f"{loss.item():.8f} {worst:.3e}")


if __name__ == "__main__":
    main()
