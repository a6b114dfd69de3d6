"""An independent safetensors reader (Python standard library only), used by
the end-to-end tests to check that model.safetensors follows the format and
to compare weights between runs. Not memtrain code: it follows the format's
published description (8-byte little-endian header length, JSON header,
little-endian data)."""

import json
import struct
import sys
from array import array

_TYPES = {"F32": ("f", 4), "F64": ("d", 8), "I64": ("q", 8), "I32": ("i", 4)}


def load(path):
    """Returns ({name: (dtype, shape, list of values)}, metadata)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"{path}: header length {n} beyond file size")
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    data = blob[8 + n :]
    meta = header.pop("__metadata__", {})
    out = {}
    spans = []
    for name, entry in header.items():
        code, size = _TYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        count = 1
        for d in entry["shape"]:
            count *= d
        if end - begin != count * size or end > len(data):
            raise ValueError(f"{path}: {name}: offsets do not match shape")
        values = array(code)
        values.frombytes(data[begin:end])
        if sys.byteorder != "little":
            values.byteswap()
        out[name] = (entry["dtype"], entry["shape"], values.tolist())
        spans.append((begin, end))
    spans.sort()
    pos = 0
    for begin, end in spans:
        if begin != pos:
            raise ValueError(f"{path}: data has a hole or overlap at {pos}")
        pos = end
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} trailing bytes")
    return out, meta


def _pairs(a, b):
    """(values of a, values of b) per tensor; the names and shapes must agree."""
    if a.keys() != b.keys():
        raise ValueError(f"different tensors: {sorted(a)} vs {sorted(b)}")
    for k in a:
        if a[k][1] != b[k][1]:
            raise ValueError(f"{k}: shapes {a[k][1]} vs {b[k][1]}")
        yield a[k][2], b[k][2]


def max_abs_diff(a, b):
    return max((max(abs(x - y) for x, y in zip(u, v)) for u, v in _pairs(a, b)), default=0.0)


def max_relative_diff(a, b):
    """The largest |a - b| of each tensor over that tensor's largest |a|."""
    return max((max(abs(x - y) for x, y in zip(u, v)) / (max(map(abs, u)) or 1.0)
                for u, v in _pairs(a, b)), default=0.0)


if __name__ == "__main__":
    # safetensors_read.py FILE [FILE2]: list tensors, or the max abs diff.
    t1, m1 = load(sys.argv[1])
    if len(sys.argv) > 2:
        t2, _ = load(sys.argv[2])
        print(f"{max_abs_diff(t1, t2):.3e}")
    else:
        for k, (dt, shape, _) in t1.items():
            print(k, dt, shape)
        print("metadata", m1)
