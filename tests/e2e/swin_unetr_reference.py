"""MONAI's SwinUNETR as the reference for memtrain's swin_unetr.

Usage: swin_unetr_reference.py make DIR IN_CHANNELS CLASSES FEATURE D H W SEED
       swin_unetr_reference.py compare DIR

make: monai.networks.nets.SwinUNETR(IN_CHANNELS, CLASSES,
feature_size=FEATURE) with MONAI's defaults, its initial weights from SEED
moved off their initial values (every floating tensor plus 0.05 x normal
noise, so that a weight loaded into the wrong place shows), in eval mode;
writes DIR/monai.safetensors (its state dict, MONAI's order, the int64
relative_position_index buffers included), DIR/monai_names.txt ("name
[shape]" per line, in order), DIR/x.safetensors (an input (1, IN_CHANNELS,
D, H, W) from SEED) and DIR/monai_logits.safetensors (MONAI's forward, fp32,
no gradients).

compare: DIR/memtrain_names.txt and DIR/memtrain_logits.safetensors
(tests/tools/forward_logits) against MONAI's: the same names, shapes and
order; logits within 1e-4 of the largest |logit| (relative). Prints one
JSON line; exits 1 on a difference.
"""

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "vs_pytorch"))
from pytorch_ddp import load_safetensors, save_safetensors  # noqa: E402


def save(path, tensors):
    save_safetensors(str(path), tensors, {"producer": "swin_unetr_reference.py"})


def load(path):
    return load_safetensors(str(path))

def shape_text(t):
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def make(d, cin, classes, feature, dd, hh, ww, seed):
    from monai.networks.nets import SwinUNETR

    d = Path(d)
    torch.manual_seed(seed)
    net = SwinUNETR(in_channels=cin, out_channels=classes, feature_size=feature)
    with torch.no_grad():
        for t in net.state_dict().values():
            if t.is_floating_point():
                t.add_(0.05 * torch.randn_like(t))
    net.eval()
    sd = net.state_dict()
    save(d / "monai.safetensors", sd)
    (d / "monai_names.txt").write_text("".join(f"{k} {shape_text(v)}\n" for k, v in sd.items()))
    x = torch.randn(1, cin, dd, hh, ww)
    save(d / "x.safetensors", {"x": x})
    with torch.no_grad():
        y = net(x)
    save(d / "monai_logits.safetensors", {"logits": y})
    print(f"MONAI SwinUNETR({cin}, {classes}, feature_size={feature}): {len(sd)} tensors, logits {tuple(y.shape)}")


def compare(d):
    d = Path(d)
    theirs = (d / "monai_names.txt").read_text().splitlines()
    ours = (d / "memtrain_names.txt").read_text().splitlines()
    failures = []
    if theirs != ours:
        diff = [f"{i}: MONAI {a!r}, memtrain {b!r}" for i, (a, b) in enumerate(zip(theirs, ours)) if a != b][:5]
        failures.append(f"state dicts differ ({len(theirs)} vs {len(ours)} tensors): {diff}")
    a = load(d / "monai_logits.safetensors")["logits"].double()
    b = load(d / "memtrain_logits.safetensors")["logits"].double()
    if a.shape != b.shape:
        failures.append(f"logits {tuple(b.shape)}, MONAI's {tuple(a.shape)}")
        rel = float("inf")
    else:
        rel = float((a - b).abs().max() / a.abs().max())
        if not rel <= 1e-4:
            failures.append(f"logits differ by {rel:.3g} of the largest")
    print(json.dumps({"tensors": len(theirs), "logits": list(a.shape), "max_rel_diff": rel, "failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        a = sys.argv[2:]
        make(a[0], *(int(v) for v in a[1:]))
    else:
        sys.exit(compare(sys.argv[2]))
