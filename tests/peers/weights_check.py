"""Byte-level checks of safetensors weights files for tests/e2e/weights.sh
(Python standard library only; follows the format's published description:
8-byte little-endian header length, JSON header, data).

  weights_check.py equal A B             every tensor of A and B: same names,
                                         dtypes, shapes and bytes
  weights_check.py frozen INIT FINAL P.. tensors named P or P.* are
                                         bit-identical, some others are not
  weights_check.py param_bytes FILE P..  bytes of the parameters (not the
                                         batch-norm buffers) named P or P.*
"""

import json
import struct
import sys

BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    header.pop("__metadata__", None)
    data = memoryview(blob)[8 + n :]
    return {k: (v["dtype"], v["shape"], bytes(data[v["data_offsets"][0] : v["data_offsets"][1]]))
            for k, v in header.items()}


def under(name, prefixes):
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def main():
    cmd = sys.argv[1]
    if cmd == "equal":
        a, b = load(sys.argv[2]), load(sys.argv[3])
        if list(a) != list(b) and sorted(a) != sorted(b):
            sys.exit(f"different names: {sorted(set(a) ^ set(b))[:8]}")
        diff = [k for k in a if a[k] != b[k]]
        if diff:
            sys.exit(f"{len(diff)} of {len(a)} tensors differ: {diff[:8]}")
        print(f"equal: {len(a)} tensors")
    elif cmd == "frozen":
        a, b = load(sys.argv[2]), load(sys.argv[3])
        prefixes = sys.argv[4:]
        frozen = [k for k in a if under(k, prefixes)]
        moved = [k for k in frozen if a[k] != b[k]]
        if not frozen or moved:
            sys.exit(f"frozen tensors changed: {moved[:8]} (of {len(frozen)})")
        others = [k for k in a if not under(k, prefixes) and not k.endswith(BUFFERS)]
        changed = [k for k in others if a[k] != b[k]]
        if not changed:
            sys.exit("no trained parameter changed")
        print(f"frozen: {len(frozen)} tensors bit-identical; "
              f"{len(changed)} of {len(others)} other parameters changed")
    elif cmd == "param_bytes":
        a = load(sys.argv[2])
        print(sum(len(v[2]) for k, v in a.items()
                  if under(k, sys.argv[3:]) and not k.endswith(BUFFERS)))
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
