"""open_clip's CLIP as the reference for model.name=clip (tests/e2e/clip_open_clip.sh).

  make DIR VARIANT SIZE N SEED FORMAT   open_clip builds VARIANT (ViT-B-32,
      ViT-B-16, tiny, each optionally -quickgelu) for SIZE x SIZE images
      with every parameter drawn at random (layer norms and biases too, so
      that a wrong name or order shows); writes DIR/pairs.h5 (N random
      uint8 images, captions tokenized by open_clip.tokenize, pair ids),
      the state dict as DIR/open_clip.FORMAT (pt: torch.save, safetensors),
      DIR/names.txt (state-dict order, "name shape"), and DIR/ref.npz: the
      logits_per_image, image and text features of CLIP.forward on the
      images normalised with OpenAI's mean and std.
  compare DIR [TOL]   DIR/emb.h5 (memtrain embed) against DIR/ref.npz:
      logits within TOL (1e-4) relative to their largest magnitude.
  order DIR WEIGHTS   the tensor names, shapes and order of a memtrain
      safetensors file are DIR/names.txt's.
  step DIR VARIANT SIZE DATA INITIAL LR [MODEL]   the float64 reference of
      memtrain's first exact window over all N rows of DATA: open_clip's
      model (in float64) from memtrain's INITIAL weights, open_clip's own
      ClipLoss of the one batch of N, its gradient, the first SGD step
      (p - LR grad: momentum's buffer starts as the gradient) and CLIP's
      clamp of the logit scale. Prints the loss and, with MODEL (memtrain's
      weights after the window), the largest |memtrain - reference|.
"""
import json
import struct
import sys

from pathlib import Path

import h5py
import numpy as np
import open_clip
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "vs_pytorch"))
from race_models import open_clip_model  # noqa: E402

CAPTIONS = [
    "a photo of a cat sitting on a red sofa",
    "Two dogs, one brown & one white, run across the beach!",
    "",
    "A diagram of the heart's four chambers (labelled).",
    "street at night, 1990s, neon lights -- rain",
    "an x-ray of a left hand",
    "ÉCOLE in Montréal; über-modern façade",
    "the quick brown fox jumps over the lazy dog " * 6,
]
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


def build(variant, size):
    """open_clip's CLIP of VARIANT for SIZE^2 images (the race's builder)."""
    return open_clip_model(variant, size)


def make(d, variant, size, n, seed, fmt):
    size, n, seed = int(size), int(n), int(seed)
    torch.manual_seed(seed)
    m = build(variant, size).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name == "logit_scale":
                p.fill_(float(np.log(1 / 0.05)) + 0.01 * seed)
            elif p.dim() <= 1 or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))  # norms and biases off their init
            else:
                p.mul_(1 + 0.2 * torch.randn_like(p))
    g = np.random.default_rng(seed)
    images = g.integers(0, 256, size=(n, 3, size, size), dtype=np.uint8)
    caps = [CAPTIONS[(i * 3 + seed) % len(CAPTIONS)] for i in range(n)]
    tokens = open_clip.tokenize(caps).numpy().astype(np.int32)
    with h5py.File(f"{d}/pairs.h5", "w") as f:
        f["images"] = images
        f["tokens"] = tokens
        f["tokens"].attrs["vocab_size"] = 49408
        f["pair_ids"] = np.arange(n, dtype=np.int64)
    sd = m.state_dict()
    if fmt == "pt":
        torch.save(sd, f"{d}/open_clip.pt")
    else:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in sd.items()}, f"{d}/open_clip.safetensors")
    with open(f"{d}/names.txt", "w") as f:
        for k, v in sd.items():
            f.write(f"{k} {list(v.shape)}\n")
    x = torch.from_numpy(images).float() / 255
    x = (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    with torch.no_grad():
        img, txt, scale = m(x, torch.from_numpy(tokens).long())
    np.savez(f"{d}/ref.npz", logits=(scale * img @ txt.T).numpy(), image=img.numpy(), text=txt.numpy())


def compare(d, tol="1e-4"):
    tol = float(tol)
    ref = np.load(f"{d}/ref.npz")
    with h5py.File(f"{d}/emb.h5", "r") as f:
        logits, a, b = f["logits"][()], f["embeddings_a"][()], f["embeddings_b"][()]
    for name, got, want in (("logits", logits, ref["logits"]), ("image", a, ref["image"]), ("text", b, ref["text"])):
        err = np.abs(got - want).max() / np.abs(want).max()
        print(f"{d}: {name} {got.shape} max relative error {err:.2e}")
        assert got.shape == want.shape and err <= tol, (name, err)


def order(d, weights):
    raw = open(weights, "rb").read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hlen])
    got = [f"{k} {v['shape']}" for k, v in header.items() if k != "__metadata__"]
    want = open(f"{d}/names.txt").read().split("\n")[:-1]
    assert got == want, "\n".join(f"{g!r} vs {w!r}" for g, w in zip(got, want) if g != w)[:2000] or (len(got), len(want))
    print(f"{weights}: {len(got)} tensors, open_clip's names, shapes and order")


def step(d, variant, size, data, initial, lr, model=None):
    from safetensors.torch import load_file

    lr = float(lr)
    m = build(variant, int(size)).double()
    m.load_state_dict({k: v.double() for k, v in load_file(initial).items()}, strict=True)
    m.train()
    with h5py.File(data, "r") as f:
        x = torch.from_numpy(f["images"][()]).double() / 255
        tokens = torch.from_numpy(f["tokens"][()].astype(np.int64))
    x = (x - torch.tensor(MEAN, dtype=torch.float64).view(3, 1, 1)) / torch.tensor(STD, dtype=torch.float64).view(3, 1, 1)
    img, txt, scale = m(x, tokens)
    loss = open_clip.ClipLoss()(img, txt, scale)
    loss.backward()
    print(f"{loss.item():.10f}")
    if model is None:
        return
    got = load_file(model)
    worst = 0.0
    with torch.no_grad():
        for k, p in m.named_parameters():
            new = p - lr * p.grad
            if k == "logit_scale":
                new = new.clamp(0.0, float(np.log(100.0)))
            worst = max(worst, (got[k].double() - new).abs().max().item())
    print(f"{worst:.3e}")


if __name__ == "__main__":
    {"make": make, "compare": compare, "order": order, "step": step}[sys.argv[1]](*sys.argv[2:])
