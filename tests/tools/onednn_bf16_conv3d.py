"""PyTorch's own CPU bfloat16 conv3d weight gradient reading uninitialized
memory (ARCHITECTURE.md Note [A oneDNN bf16 gradient bug]): the reason
memtrain refuses training.amp=bf16 on the CPU where a 3x3x3 convolution
would see a depth of 2 voxels (check_cpu_bf16_convolutions).

Usage: python onednn_bf16_conv3d.py   (any torch; prints one line per shape)

Each trial fills freed host memory with NaN, then runs conv3d (3x3x3,
padding 1) under CPU bf16 autocast on an input of the given shape and
counts trials whose weight gradient is not finite. With torch 2.11.0
(measured 2026-11-27 on the development VM): depth 2 gives non-finite
gradients in most trials, other depths (and oneDNN disabled) in none.
"""
import torch


def trial(shape, mkldnn=True):
    w = torch.randn(96, shape[1], 3, 3, 3, requires_grad=True)
    x = torch.randn(*shape, requires_grad=True)
    junk = [torch.full((n,), float("nan")) for n in (10**5, 10**6, 4 * 10**6, 5 * 10**5)]
    del junk
    with torch.backends.mkldnn.flags(enabled=mkldnn), torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.conv3d(x, w, padding=1)
        y.float().square().sum().backward()
    return bool(torch.isfinite(w.grad).all())


if __name__ == "__main__":
    torch.manual_seed(0)
    n = 10
    for shape, mkldnn in [((2, 192, 2, 2, 4), True), ((2, 192, 2, 6, 6), True), ((2, 192, 6, 6, 2), True),
                          ((2, 192, 3, 3, 3), True), ((2, 192, 6, 6, 6), True), ((2, 192, 2, 2, 4), False)]:
        bad = sum(not trial(shape, mkldnn) for _ in range(n))
        print(f"torch {torch.__version__} conv3d bf16 input {shape} oneDNN {'on' if mkldnn else 'off'}: "
              f"non-finite weight gradient in {bad} of {n} trials")
