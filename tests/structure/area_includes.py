#!/usr/bin/env python3
"""The includes between memtrain's areas, and the rule they keep.

Areas are the folders under src/ and include/memtrain/ (train/'s
sub-areas count as areas of their own). Each area may include only areas
before it in ORDER: an include that runs back up (a loop between areas)
is printed and the exit status is 1. With --table, every pair of areas
that includes the other is printed with its count of includes.

    python3 tests/structure/area_includes.py [--table] [ROOT]
"""
import collections
import os
import re
import sys

# From the bottom up (ARCHITECTURE.md "Areas").
ORDER = [
    "util", "compat", "config", "formats", "data", "metrics", "memory",
    "device", "dist", "model", "weights", "input", "convert", "infer",
    "train/state", "train/logs", "train/eval", "train/tasks",
    "train/records", "train/run_files", "train/loop", "cli",
]
RANK = {a: i for i, a in enumerate(ORDER)}
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')


def area_of(path):
    """`path` relative to src/ or include/memtrain/ -> its area."""
    parts = path.split("/")
    if parts[0] == "train" and len(parts) > 2:
        return "train/" + parts[1]
    if len(parts) == 1:
        return parts[0].split(".")[0]
    return parts[0]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    table = "--table" in sys.argv
    root = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "..")
    edges = collections.Counter()
    where = collections.defaultdict(list)
    unknown = set()
    for base in ("src", "include/memtrain"):
        top = os.path.join(root, base)
        for folder, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith((".h", ".cpp", ".cu", ".inc")):
                    continue
                full = os.path.join(folder, name)
                rel = os.path.relpath(full, top)
                a = area_of(rel)
                with open(full, errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        inc = m.group(1)
                        if inc.startswith("memtrain/"):
                            b = area_of(inc[len("memtrain/"):])
                        elif "/" in inc:
                            b = area_of(inc)
                        else:
                            b = a  # a private header beside the source
                        for x in (a, b):
                            if x not in RANK:
                                unknown.add(x)
                        if a != b:
                            edges[(a, b)] += 1
                            where[(a, b)].append("%s/%s:%d" % (base, rel, n))
    if unknown:
        print("areas missing from ORDER in %s: %s" % (__file__, ", ".join(sorted(unknown))))
        return 1
    up = [(a, b) for (a, b) in edges if RANK[b] > RANK[a]]
    if table:
        for (a, b), n in sorted(edges.items(), key=lambda e: (RANK[e[0][0]], RANK[e[0][1]])):
            print("%-16s -> %-16s %3d" % (a, b, n))
    for a, b in sorted(up):
        print("upward include: %s -> %s (%s is above %s in ORDER): %s"
              % (a, b, b, a, ", ".join(where[(a, b)])))
    print("%d areas, %d pairs of areas with includes, %d upward"
          % (len(ORDER), len(edges), len(up)))
    return 1 if up else 0


if __name__ == "__main__":
    sys.exit(main())
