"""An independent PyTorch reference for memtrain's few-shot cosine
transformer head (model.head: cosine_transformer; ARCHITECTURE.md, Note [The
few-shot cosine transformer]).

The head is written here as the official FS-CT code lays it out (Nguyen et
al., IEEE Access 2023; github.com/vinuni-vishc/Few-Shot-Cosine-Transformer,
methods/transformer.py, variant "cosine"), one episode at a time:
prototypes (1, N, D) as the attention's queries, the query embeddings
(Q, 1, D) as its keys and values, cos(f_q, f_k) = f_q f_k^T / (|f_q| |f_k|)
per head, no softmax, no scale; one Attention and one FFN applied `depth`
times; a final LayerNorm, Linear and a cosine linear layer under weight
normalisation with scale 2. One difference from the official code, as the
paper has it: the cosine output layer normalises each (query, class) vector
over its features (the official code's torch.norm(x, dim=1) on the (Q, N, d)
tensor normalises over the classes).

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
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fewshot_reference import draw_episode, load_safetensors, mlp_embed, read_split  # noqa: E402


def cosine_distance(x1, x2):
    """x1 (h, a, n, d), x2 (h, b, d, m) -> (h, max(a, b), n, m): cosines."""
    dots = torch.matmul(x1, x2)
    return dots / (torch.norm(x1, dim=-1, keepdim=True) * torch.norm(x2, dim=-2, keepdim=True))


class Attention(nn.Module):
    def __init__(self, dim, heads, dim_head):
        super().__init__()
        self.heads = heads
        self.input_linear = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, heads * dim_head, bias=False))
        project = not (heads == 1 and dim_head == dim)
        self.output_linear = nn.Linear(heads * dim_head, dim) if project else nn.Identity()

    def forward(self, q, k, v):
        def split(t):  # 'q n (h d) -> h q n d'
            t = self.input_linear(t)
            return t.view(t.shape[0], t.shape[1], self.heads, -1).permute(2, 0, 1, 3)

        f_q, f_k, f_v = split(q), split(k), split(v)
        dots = cosine_distance(f_q, f_k.transpose(-1, -2))  # (h, Q, N, 1)
        out = torch.matmul(dots, f_v)  # (h, Q, N, dh)
        out = out.permute(1, 2, 0, 3).reshape(out.shape[1], out.shape[2], -1)
        return self.output_linear(out)


class CosineDistLinear(nn.Module):
    def __init__(self, indim, outdim):
        super().__init__()
        self.L = nn.utils.parametrizations.weight_norm(nn.Linear(indim, outdim, bias=False), dim=0)
        self.scale_factor = 2

    def forward(self, x):
        # Over the features (the paper's cosine); see the module docstring.
        return self.scale_factor * self.L(F.normalize(x, dim=-1))


class FSCT(nn.Module):
    def __init__(self, dim, n, k, heads, dim_head, mlp_dim, depth):
        super().__init__()
        self.depth = depth
        self.ATTN = Attention(dim, heads, dim_head)
        self.proto_weight = nn.Parameter(torch.ones(n, k, 1))
        self.FFN = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))
        self.linear = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim_head), CosineDistLinear(dim_head, 1))

    def forward(self, z_support, z_query):  # (N, K, D), (Q, D) -> (Q, N)
        x = (z_support * self.proto_weight.softmax(-2)).sum(1).unsqueeze(0)
        query = z_query.unsqueeze(1)
        for _ in range(self.depth):
            x = self.ATTN(q=x, k=query, v=query) + x
            x = self.FFN(x) + x
        return self.linear(x).squeeze(-1)

    # memtrain's parameter names (fsct.*) -> this module's.
    NAMES = {
        "proto_weight": "proto_weight",
        "attn_norm.weight": "ATTN.input_linear.0.weight",
        "attn_norm.bias": "ATTN.input_linear.0.bias",
        "attn_in.weight": "ATTN.input_linear.1.weight",
        "attn_out.weight": "ATTN.output_linear.weight",
        "attn_out.bias": "ATTN.output_linear.bias",
        "ffn_norm.weight": "FFN.0.weight",
        "ffn_norm.bias": "FFN.0.bias",
        "ffn_fc1.weight": "FFN.1.weight",
        "ffn_fc1.bias": "FFN.1.bias",
        "ffn_fc2.weight": "FFN.3.weight",
        "ffn_fc2.bias": "FFN.3.bias",
        "out_norm.weight": "linear.0.weight",
        "out_norm.bias": "linear.0.bias",
        "out_fc.weight": "linear.1.weight",
        "out_fc.bias": "linear.1.bias",
        "cos_weight_g": "linear.2.L.parametrizations.weight.original0",
        "cos_weight_v": "linear.2.L.parametrizations.weight.original1",
    }


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
