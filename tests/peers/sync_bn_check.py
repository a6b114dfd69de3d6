"""Compares two memtrain weights files of a ResNet for tests/e2e/sync_bn.sh
(Python standard library only, through tests/peers/safetensors_read.py).

  sync_bn_check.py A B   prints "PARAMS BUFFERS COUNTS": for the
                         parameters and for the batch-norm buffers
                         (running_mean, running_var) the largest over
                         tensors of max |a - b| / max(1, max |a|); COUNTS is
                         "equal" when every num_batches_tracked is, else
                         "differ"
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import safetensors_read  # noqa: E402

BUFFERS = ("running_mean", "running_var")


def main():
    a, _ = safetensors_read.load(sys.argv[1])
    b, _ = safetensors_read.load(sys.argv[2])
    if sorted(a) != sorted(b):
        sys.exit(f"different tensors: {sorted(set(a) ^ set(b))[:8]}")
    worst = {"params": 0.0, "buffers": 0.0}
    counts = "equal"
    for name, (dtype, shape, va) in a.items():
        vb = b[name][2]
        if b[name][1] != shape:
            sys.exit(f"{name}: shapes {shape} vs {b[name][1]}")
        if name.endswith("num_batches_tracked"):
            if va != vb:
                counts = "differ"
            continue
        scale = max(1.0, max(abs(x) for x in va))
        d = max(abs(x - y) for x, y in zip(va, vb)) / scale
        group = "buffers" if name.endswith(BUFFERS) else "params"
        worst[group] = max(worst[group], d)
    print(f"{worst['params']:.3e} {worst['buffers']:.3e} {counts}")


if __name__ == "__main__":
    main()
