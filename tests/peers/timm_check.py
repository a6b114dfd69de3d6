"""An independent check of memtrain's ResNets against timm (optional: needs
timm, torch, torchvision, safetensors and h5py; tests/e2e/weights.sh skips
it when they cannot be imported).

  timm_check.py make NAME CLASSES IN_CHANS OUT.safetensors
      timm's NAME with CLASSES outputs, its batch-norm statistics drawn at
      random (so that eval mode depends on them), its state_dict() saved
  timm_check.py loss NAME WEIGHTS VAL.h5
      loads WEIGHTS into timm's NAME with load_state_dict(strict=True), runs
      it in eval mode on VAL.h5's /images (converted as docs/data-format.md
      says, then, for 3 channels, normalised with ImageNet's mean and std
      as memtrain's data.normalize=auto does for the ResNets) and prints {"val_loss": mean cross-entropy, "val_accuracy": ...}
"""

import json
import sys

import h5py
import numpy as np
import timm
import torch
from safetensors.torch import load_file, save_file


def images(path):
    with h5py.File(path, "r") as f:
        d = f["images"]
        x = d[...]
        if x.dtype.kind in "iu":
            scale = d.attrs.get("scale", 1 / 255 if x.dtype == np.uint8 else 1.0)
            shift = d.attrs.get("shift", 0.0)
            x = x.astype(np.float32) * scale + shift
        x = torch.from_numpy(x.astype(np.float32))
        if x.shape[1] == 3:  # data.normalize=auto (imagenet) for the ResNets
            mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
            std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
            x = (x - mean) / std
        return x, torch.from_numpy(f["labels"][...].astype(np.int64))


def main():
    torch.manual_seed(0)
    if sys.argv[1] == "make":
        name, classes, chans, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        m = timm.create_model(name, pretrained=False, num_classes=classes, in_chans=chans)
        with torch.no_grad():
            for mod in m.modules():
                if isinstance(mod, torch.nn.BatchNorm2d):
                    mod.running_mean.normal_(0, 0.1)
                    mod.running_var.uniform_(0.5, 1.5)
                    mod.weight.uniform_(0.5, 1.5)  # no zero gammas
                    mod.num_batches_tracked.fill_(7)
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, out)
        print(f"timm {name}: {sum(p.numel() for p in m.parameters())} parameters, "
              f"{len(m.state_dict())} tensors -> {out}")
    else:
        name, weights, val = sys.argv[2], sys.argv[3], sys.argv[4]
        sd = load_file(weights)
        m = timm.create_model(name, pretrained=False, num_classes=sd["fc.bias"].numel(),
                              in_chans=sd["conv1.weight"].shape[1])
        m.load_state_dict(sd, strict=True)
        m.eval()
        x, y = images(val)
        with torch.no_grad():
            logits = m(x).double()
        loss = torch.nn.functional.cross_entropy(logits, y).item()
        acc = (logits.argmax(1) == y).double().mean().item()
        print(json.dumps({"val_loss": loss, "val_accuracy": acc}))


if __name__ == "__main__":
    main()
