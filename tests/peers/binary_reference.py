"""An independent PyTorch check of a binary classifier's validation
(model.num_classes=1): builds memtrain's feature MLP in PyTorch
(benchmarks/vs_pytorch/race_models.py's FeatureMlp, memtrain's names) from
model.safetensors, runs it on VAL.h5's /features, and recomputes
- val_auc by counting every (positive, negative) pair (1 when the
  positive's logit is higher, 1/2 when equal): sklearn's roc_auc_score;
- val_accuracy: (logit > 0) == label;
- val_loss: the mean binary cross-entropy against y (1 - s) + s / 2.
Prints them as JSON.

usage: binary_reference.py VAL.h5 MODEL.safetensors HIDDEN DEPTH SMOOTHING
"""

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "vs_pytorch"))
sys.path.insert(0, str(ROOT / "tests" / "peers"))
from race_models import FeatureMlp  # noqa: E402
import safetensors_read  # noqa: E402


def main():
    val, weights = sys.argv[1], sys.argv[2]
    hidden, depth, s = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    with h5py.File(val, "r") as f:
        x = torch.from_numpy(f["features"][...].astype(np.float32))
        y = torch.from_numpy(f["labels"][...].astype(np.int64))
    model = FeatureMlp(x.shape[1], hidden, depth, 1, norm=False)
    tensors, _ = safetensors_read.load(weights)
    state = {
        name: torch.tensor(values, dtype=torch.float32).reshape(shape)
        for name, (dtype, shape, values) in tensors.items()
    }
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        z = model(x).squeeze(1).double()
    t = y.double() * (1 - s) + s / 2
    loss = F.binary_cross_entropy_with_logits(z, t).item()
    acc = ((z > 0).long() == y).double().mean().item()
    pos, neg = z[y == 1], z[y == 0]
    credit = (pos[:, None] > neg[None, :]).double().sum() + 0.5 * (
        pos[:, None] == neg[None, :]
    ).double().sum()
    auc = (credit / (len(pos) * len(neg))).item()
    print(json.dumps({"val_auc": auc, "val_accuracy": acc, "val_loss": loss}))


if __name__ == "__main__":
    main()
