"""timm's DINOv3 ViT as the reference for memtrain's (tests/e2e/dinov3_timm.sh).

make OUT VARIANT SEED
    Builds timm's vit_*_patch16_dinov3_qkvb and vit_*_patch16_dinov3 (random
    weights, every tensor perturbed: layer scales, norms, biases, tokens),
    and writes into OUT:
      timm.pth, timm.safetensors     the _qkvb model's state dict, timm's names
      timm_noqkvb.pth                the model without q/v biases
      meta.pth                       the _qkvb state dict in Meta's names
                                     (storage_tokens, mask_token, ls1.gamma,
                                     qkv.bias with a random key part that
                                     bias_mask removes, bias_mask,
                                     rope_embed.periods); timm's own converter
                                     (eva.checkpoint_filter_fn) must turn it
                                     back into timm.pth exactly
      meta_bf16.pth                  the same with periods in bfloat16, as
                                     Meta's released files store them
      meta_nan_mask.pth              a bias_mask full of NaN (Meta's module
                                     before init_weights): must be refused
      inputs.safetensors             x_224 (2, 3, 224, 224), x_256x320
      expected.safetensors           per input K and layer i of [2, 5, 8, 11]:
      expected_noqkvb.safetensors    K/layer_i (B, D, h, w) and K/cls_i (B, D)
      expected_bf16.safetensors      from forward_intermediates(norm=True,
                                     output_fmt='NCHW', return_prefix_tokens=
                                     True); _bf16: timm's model with the
                                     bfloat16 periods (Meta's numerics for
                                     meta_bf16.pth)
compare GOT EXPECTED [TOL]
    Every tensor of EXPECTED against GOT: max |got - expected| <= TOL
    (1e-5) times the largest |expected| of that tensor. Prints the worst.
differ A B [TOL]
    Exits 0 when some tensor of A and B differs by more than TOL times its
    largest value (the bfloat16 periods are visible at that tolerance).
"""

import sys

import safetensors.torch as st
import timm
import torch
from timm.models.eva import checkpoint_filter_fn

ARCH = {
    "vits16": ("vit_small_patch16_dinov3", {}, [2, 5, 8, 11]),
    "vitb16": ("vit_base_patch16_dinov3", {}, [2, 5, 8, 11]),
    "tiny": ("vit_small_patch16_dinov3", dict(embed_dim=64, depth=4, num_heads=2), [0, 1, 2, 3]),
}


def build(variant, seed, qkvb):
    torch.manual_seed(seed)
    name, kw, layers = ARCH[variant]
    m = timm.create_model(name + ("_qkvb" if qkvb else ""), pretrained=False, **kw).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith(("gamma_1", "gamma_2")):
                p.uniform_(0.5, 1.5)
            elif p.dim() == 1 and n.endswith(".weight"):
                p.normal_(1.0, 0.1)
            else:
                p.add_(0.02 * torch.randn_like(p))
    return m, layers


def to_meta(tsd, m):
    """timm's state dict in Meta's names and order (dinov3 vision_transformer.py)."""
    d = m.embed_dim
    out = {
        "cls_token": tsd["cls_token"],
        "storage_tokens": tsd["reg_token"],
        "mask_token": torch.zeros(1, d),
        "patch_embed.proj.weight": tsd["patch_embed.proj.weight"],
        "patch_embed.proj.bias": tsd["patch_embed.proj.bias"],
        "rope_embed.periods": m.rope.periods.detach().clone(),
    }
    for i in range(len(m.blocks)):
        p = f"blocks.{i}."
        q = tsd.get(p + "attn.q_bias", torch.zeros(d))
        v = tsd.get(p + "attn.v_bias", torch.zeros(d))
        out[p + "norm1.weight"] = tsd[p + "norm1.weight"]
        out[p + "norm1.bias"] = tsd[p + "norm1.bias"]
        out[p + "attn.qkv.weight"] = tsd[p + "attn.qkv.weight"]
        # A key part that is not zero: Meta's mask must remove it (timm's
        # converter drops it).
        out[p + "attn.qkv.bias"] = torch.cat([q, torch.randn(d), v])
        out[p + "attn.qkv.bias_mask"] = torch.cat([torch.ones(d), torch.zeros(d), torch.ones(d)])
        out[p + "attn.proj.weight"] = tsd[p + "attn.proj.weight"]
        out[p + "attn.proj.bias"] = tsd[p + "attn.proj.bias"]
        out[p + "ls1.gamma"] = tsd[p + "gamma_1"]
        for k in ("norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
                  "mlp.fc2.weight", "mlp.fc2.bias"):
            out[p + k] = tsd[p + k]
        out[p + "ls2.gamma"] = tsd[p + "gamma_2"]
    out["norm.weight"] = tsd["norm.weight"]
    out["norm.bias"] = tsd["norm.bias"]
    return out


def features(m, layers, xs):
    exp = {}
    for k, x in xs.items():
        with torch.no_grad():
            _, inter = m.forward_intermediates(
                x, indices=layers, norm=True, output_fmt="NCHW",
                return_prefix_tokens=True, stop_early=False)
        for i, (fmap, prefix) in zip(layers, inter):
            exp[f"{k}/layer_{i}"] = fmap.contiguous()
            exp[f"{k}/cls_{i}"] = prefix[:, 0].contiguous()
    return exp


def set_periods(m, periods):
    m.rope.periods.copy_(periods)
    if m.rope.feat_shape is not None:  # its cached embedding of the default grid
        m.rope._cache_embed(list(m.rope.feat_shape))


def make(out, variant, seed):
    seed = int(seed)
    m, layers = build(variant, seed, qkvb=True)
    tsd = {k: v.contiguous() for k, v in m.state_dict().items()}
    torch.save(tsd, f"{out}/timm.pth")
    st.save_file(tsd, f"{out}/timm.safetensors")
    msd = to_meta(tsd, m)
    back = checkpoint_filter_fn(dict(msd), m)
    assert back.keys() == tsd.keys(), sorted(set(back) ^ set(tsd))
    for k in tsd:
        assert torch.equal(back[k], tsd[k]), k
    torch.save(msd, f"{out}/meta.pth")
    b16 = dict(msd)
    b16["rope_embed.periods"] = msd["rope_embed.periods"].to(torch.bfloat16)
    torch.save(b16, f"{out}/meta_bf16.pth")
    bad = dict(msd)
    bad["blocks.1.attn.qkv.bias_mask"] = torch.full_like(bad["blocks.1.attn.qkv.bias_mask"], float("nan"))
    torch.save(bad, f"{out}/meta_nan_mask.pth")

    g = torch.Generator().manual_seed(seed + 1)
    xs = {"x_224": torch.randn(2, 3, 224, 224, generator=g),
          "x_256x320": torch.randn(2, 3, 256, 320, generator=g)}
    st.save_file(xs, f"{out}/inputs.safetensors")
    st.save_file(features(m, layers, xs), f"{out}/expected.safetensors")
    set_periods(m, b16["rope_embed.periods"].float())
    st.save_file(features(m, layers, xs), f"{out}/expected_bf16.safetensors")

    n, _ = build(variant, seed + 2, qkvb=False)
    torch.save({k: v.contiguous() for k, v in n.state_dict().items()}, f"{out}/timm_noqkvb.pth")
    st.save_file(features(n, layers, xs), f"{out}/expected_noqkvb.safetensors")


def worst(a, b):
    out = []
    for k, e in b.items():
        assert k in a, f"{k} missing from what memtrain wrote"
        assert a[k].shape == e.shape, f"{k}: {tuple(a[k].shape)} vs {tuple(e.shape)}"
        out.append(((a[k].double() - e.double()).abs().max().item() / e.abs().max().item(), k))
    return max(out)


def compare(got, expected, tol="1e-5"):
    rel, k = worst(st.load_file(got), st.load_file(expected))
    print(f"{got} vs {expected}: worst {k}, max |d| = {rel:.3g} of the largest value (tolerance {tol})")
    sys.exit(0 if rel <= float(tol) else 1)


def differ(a, b, tol="1e-5"):
    rel, k = worst(st.load_file(a), st.load_file(b))
    print(f"{a} vs {b}: largest difference {k}, {rel:.3g} of the largest value")
    sys.exit(0 if rel > float(tol) else 1)


if __name__ == "__main__":
    torch.set_num_threads(1)
    {"make": make, "compare": compare, "differ": differ}[sys.argv[1]](*sys.argv[2:])
