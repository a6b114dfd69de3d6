"""Writes the state-dict key list of timm's resnet50 / seresnext50_32x4d
(1000 classes, 3 input channels) from the architecture alone (timm's
ResNet with Bottleneck blocks; SE: timm's SEModule, rd =
make_divisible(channels / 16, 8)), one `name shape dtype` line per tensor in
state-dict order, and prints the parameter count to stderr.

  python3 tests/peers/resnet_keys.py seresnext50_32x4d > tests/data/seresnext50_32x4d_keys.txt

Independent of memtrain's C++ code: tests/unit/model/resnet_test.cpp
compares the model with these files."""

import sys


def make_divisible(v, divisor=8):
    # timm's make_divisible with round_limit=0 (min_value = divisor)
    return max(divisor, int(v + divisor / 2) // divisor * divisor)


def keys(name, classes=1000, in_chans=3):
    cardinality, base_width, se = {
        "resnet50": (1, 64, False),
        "seresnext50_32x4d": (32, 4, True),
    }[name]
    out = []

    def conv(n, o, i, k, groups=1, bias=False):
        out.append((n + ".weight", [o, i // groups, k, k], "F32"))
        if bias:
            out.append((n + ".bias", [o], "F32"))

    def bn(n, c):
        out.append((n + ".weight", [c], "F32"))
        out.append((n + ".bias", [c], "F32"))
        out.append((n + ".running_mean", [c], "F32"))
        out.append((n + ".running_var", [c], "F32"))
        out.append((n + ".num_batches_tracked", [], "I64"))

    conv("conv1", 64, in_chans, 7)
    bn("bn1", 64)
    inplanes = 64
    for stage, (blocks, planes) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for b in range(blocks):
            p = f"layer{stage + 1}.{b}"
            stride = 2 if b == 0 and stage > 0 else 1
            width = int(planes * (base_width / 64)) * cardinality
            outplanes = planes * 4
            conv(p + ".conv1", width, inplanes, 1)
            bn(p + ".bn1", width)
            conv(p + ".conv2", width, width, 3, groups=cardinality)
            bn(p + ".bn2", width)
            conv(p + ".conv3", outplanes, width, 1)
            bn(p + ".bn3", outplanes)
            if se:
                rd = make_divisible(outplanes / 16)
                conv(p + ".se.fc1", rd, outplanes, 1, bias=True)
                conv(p + ".se.fc2", outplanes, rd, 1, bias=True)
            if stride != 1 or inplanes != outplanes:
                conv(p + ".downsample.0", outplanes, inplanes, 1)
                bn(p + ".downsample.1", outplanes)
            inplanes = outplanes
    out.append(("fc.weight", [classes, inplanes], "F32"))
    out.append(("fc.bias", [classes], "F32"))
    return out


if __name__ == "__main__":
    entries = keys(sys.argv[1])
    params = 0
    for n, shape, dtype in entries:
        print(n, "[" + ",".join(map(str, shape)) + "]", dtype)
        if not n.endswith(("running_mean", "running_var", "num_batches_tracked")):
            c = 1
            for d in shape:
                c *= d
            params += c
    print(f"{sys.argv[1]}: {len(entries)} tensors, {params} parameters", file=sys.stderr)
