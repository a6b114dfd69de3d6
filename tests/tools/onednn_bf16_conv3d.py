"""PyTorch's own CPU bfloat16 conv3d weight gradient reading uninitialized
memory (ARCHITECTURE.md Note [A oneDNN bf16 gradient bug]): the reason
memtrain refuses training.amp=bf16 on the CPU where a 3x3x3 convolution
would see a depth of 2 voxels (check_cpu_bf16_convolutions), and only
that axis.

Usage: python onednn_bf16_conv3d.py [TRIALS]   (any torch; one line per
shape: TRIALS trials each, 10 by default)

Each trial fills freed host memory with NaN, then runs conv3d (3x3x3,
padding 1, 96 outputs) under CPU bf16 autocast on an input of the shape,
and compares the weight gradient with float64's on the same bf16-rounded
input and weight: non-finite, or its relative error (the norm of the
difference over float64's norm) above 0.02, is wrong. bf16's own rounding
gives about 0.003 here, with oneDNN or without. Each axis of size 2 is
tried alone, all three at once, and shapes without one, with oneDNN on and
off.
"""
import sys

import torch

BAD = 0.02  # relative error of a wrong gradient; bf16 rounding: ~0.003


def trial(shape, mkldnn, seed):
    """(finite, relative error) of one trial's bf16 weight gradient."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(96, shape[1], 3, 3, 3, generator=g)
    x = torch.randn(*shape, generator=g)
    junk = [torch.full((n,), float("nan")) for n in (10**5, 10**6, 4 * 10**6, 5 * 10**5)]
    del junk
    wb = w.clone().requires_grad_()
    with torch.backends.mkldnn.flags(enabled=mkldnn), torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.conv3d(x, wb, padding=1)
        y.float().square().sum().backward()
    w64 = w.bfloat16().double().requires_grad_()
    y64 = torch.nn.functional.conv3d(x.bfloat16().double(), w64, padding=1)
    (want,) = torch.autograd.grad(y64.square().sum(), w64)
    got = wb.grad.double()
    if not bool(torch.isfinite(got).all()):
        return False, float("inf")
    return True, float((got - want).norm() / want.norm())


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    spatial = [(2, 6, 6), (6, 2, 6), (6, 6, 2), (2, 2, 2), (2, 2, 4), (3, 3, 3), (4, 4, 4), (6, 6, 6)]
    for d, h, w in spatial:
        for mkldnn in (True, False):
            res = [trial((2, 192, d, h, w), mkldnn, s) for s in range(n)]
            nonfinite = sum(not f for f, _ in res)
            wrong = sum(f and e > BAD for f, e in res)
            finite = [e for f, e in res if f]
            worst = f"{max(finite):.3g}" if finite else "-"
            print(f"torch {torch.__version__} conv3d bf16 input (2, 192, {d}, {h}, {w}) oneDNN "
                  f"{'on ' if mkldnn else 'off'}: {nonfinite} of {n} non-finite, {wrong} finite but wrong "
                  f"(relative error > {BAD}); worst finite relative error {worst}")
