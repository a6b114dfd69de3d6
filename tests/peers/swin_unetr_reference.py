"""MONAI's SwinUNETR as the reference for memtrain's swin_unetr.

Usage: swin_unetr_reference.py make DIR IN_CHANNELS CLASSES FEATURE D H W SEED
       swin_unetr_reference.py compare DIR
       swin_unetr_reference.py ssl DIR IN_CHANNELS CLASSES FEATURE SEED
       swin_unetr_reference.py check-ssl DIR RUN

make: monai.networks.nets.SwinUNETR(IN_CHANNELS, CLASSES,
feature_size=FEATURE) with MONAI's defaults, its initial weights from SEED
moved off their initial values (every floating tensor plus 0.05 x normal
noise, so that a weight loaded into the wrong place shows), in eval mode;
writes DIR/monai.safetensors (its state dict, MONAI's order, the int64
relative_position_index buffers included), DIR/monai.pt (the same state
dict as torch.save writes it, the file users have), DIR/monai_names.txt ("name
[shape]" per line, in order), DIR/x.safetensors (an input (1, IN_CHANNELS,
D, H, W) from SEED) and DIR/monai_logits.safetensors (MONAI's forward, fp32,
no gradients).

compare: DIR/memtrain_names.txt and DIR/memtrain_logits.safetensors
(tests/tools/forward_logits) against MONAI's: the same names, shapes and
order; logits within 1e-4 of the largest |logit| (relative). Prints one
JSON line; exits 1 on a difference.

ssl: self-supervised encoder weights as MONAI's released model_swinvit.pt
holds them (the names SwinUNETR.load_from reads: "module." for "swinViT.",
mlp.fc1/fc2 for mlp.linear1/linear2, under "state_dict" beside an epoch and
an optimizer's state) from a SwinUNETR of SEED, perturbed, plus the SSL
heads no SwinUNETR has (rotation_head, contrastive_head); writes
DIR/model_swinvit.pt and DIR/ssl_loaded.safetensors: the swinViT.* tensors
of another SwinUNETR after MONAI's own load_from read the file.

check-ssl: RUN is a memtrain run (model.freeze [swinViT],
output.save_initial) with model.pretrained = DIR/model_swinvit.pt, strict
false, and the rules '^module\\. -> swinViT.' and
'\\.mlp\\.fc([12])\\. -> .mlp.linear$1.': its pretrained record loaded
exactly the swinViT.* tensors, reports every other tensor of the model as
missing and the heads as unexpected; its initial.safetensors and
model.safetensors hold MONAI's load_from values for swinViT.*.
"""

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "vs_pytorch"))
from race_data import load_safetensors, save_safetensors  # noqa: E402


def save(path, tensors):
    save_safetensors(str(path), tensors, {"producer": "swin_unetr_reference.py"})


def load(path):
    return load_safetensors(str(path))

def shape_text(t):
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def perturbed(cin, classes, feature, seed):
    """MONAI's SwinUNETR from SEED, every floating tensor moved by 0.05 x noise."""
    from monai.networks.nets import SwinUNETR

    torch.manual_seed(seed)
    net = SwinUNETR(in_channels=cin, out_channels=classes, feature_size=feature)
    with torch.no_grad():
        for t in net.state_dict().values():
            if t.is_floating_point():
                t.add_(0.05 * torch.randn_like(t))
    return net


def make(d, cin, classes, feature, dd, hh, ww, seed):
    d = Path(d)
    net = perturbed(cin, classes, feature, seed)
    net.eval()
    sd = net.state_dict()
    save(d / "monai.safetensors", sd)
    torch.save(sd, d / "monai.pt")
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


def ssl(d, cin, classes, feature, seed):
    from monai.networks.nets import SwinUNETR

    d = Path(d)
    net = perturbed(cin, classes, feature, seed)
    wstate = {}
    for k, v in net.state_dict().items():
        if k.startswith("swinViT."):
            name = "module." + k[len("swinViT."):]
            wstate[name.replace(".mlp.linear1.", ".mlp.fc1.").replace(".mlp.linear2.", ".mlp.fc2.")] = v
    dim = 16 * feature
    wstate["module.rotation_head.weight"] = torch.randn(4, dim)
    wstate["module.rotation_head.bias"] = torch.randn(4)
    wstate["module.contrastive_head.weight"] = torch.randn(512, dim)
    optimizer = {"state": {}, "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "params": [0, 1]}]}
    torch.save({"epoch": 100, "state_dict": wstate, "optimizer": optimizer}, d / "model_swinvit.pt")
    ref = SwinUNETR(in_channels=cin, out_channels=classes, feature_size=feature)
    ref.load_from(torch.load(d / "model_swinvit.pt", weights_only=True))
    save(d / "ssl_loaded.safetensors", {k: v for k, v in ref.state_dict().items() if k.startswith("swinViT.")})
    print(f"model_swinvit.pt: {len(wstate)} tensors")


def check_ssl(d, run):
    d, run = Path(d), Path(run)
    theirs = load(d / "ssl_loaded.safetensors")
    final = load(run / "model.safetensors")
    initial = load(run / "initial.safetensors")
    rec = [json.loads(l) for l in open(run / "metrics.jsonl") if '"pretrained"' in l]
    failures = []
    if len(rec) != 1:
        failures.append(f"{len(rec)} pretrained records")
        rec = [{}]
    rec = rec[0]
    heads = ["swinViT.rotation_head.weight", "swinViT.rotation_head.bias", "swinViT.contrastive_head.weight"]
    others = [k for k in final if not k.startswith("swinViT.")]
    want = {"entry": "state_dict", "strict": False, "loaded": len(theirs), "renamed": len(theirs) + len(heads),
            "missing": others, "unexpected": heads, "mismatched": []}
    for k, v in want.items():
        if rec.get(k) != v:
            failures.append(f"pretrained record {k}: {rec.get(k)!r}, want {v!r}"[:300])
    for k, v in theirs.items():
        for name, got in (("initial", initial), ("model", final)):
            if k not in got or not torch.equal(got[k], v):
                failures.append(f"{name}.safetensors {k}: not MONAI's load_from value")
    print(json.dumps({"loaded": rec.get("loaded"), "missing": len(rec.get("missing", [])),
                      "unexpected": rec.get("unexpected"), "failures": failures[:8]}))
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        a = sys.argv[2:]
        make(a[0], *(int(v) for v in a[1:]))
    elif sys.argv[1] == "ssl":
        a = sys.argv[2:]
        ssl(a[0], *(int(v) for v in a[1:]))
    elif sys.argv[1] == "check-ssl":
        sys.exit(check_ssl(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(compare(sys.argv[2]))
