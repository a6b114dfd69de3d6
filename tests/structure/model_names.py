#!/usr/bin/env python3
"""No code outside src/model/ tests a model name (ARCHITECTURE.md, model/).

A model's traits are its row in src/model/registry.cpp; code elsewhere asks
the row (model_row(name).conv2d, trains_on(name, kOnVolumes), ...). This
prints every place under src/ and include/memtrain/ outside the model area
that compares a ModelName (==, !=, case, a switch's label) or compares text
with a model's spelling, and exits 1 if there is one.

    python3 tests/structure/model_names.py [ROOT]
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
choices = open(os.path.join(root, "include/memtrain/config/choices.h")).read()
m = re.search(r"MEMTRAIN_CHOICE\(ModelName,(.*?)\)\s*\n(//|MEMTRAIN)", choices, re.S)
spellings = re.findall(r'"([^"]+)"', m.group(1))
assert spellings, "no ModelName spellings found in config/choices.h"
tests = [
    re.compile(r"[=!]=\s*ModelName::k\w+"),
    re.compile(r"ModelName::k\w+\s*[=!]="),
    re.compile(r"case\s+ModelName::"),
    re.compile(r"[=!]=\s*\"(%s)\"" % "|".join(map(re.escape, spellings))),
    re.compile(r"\"(%s)\"\s*[=!]=" % "|".join(map(re.escape, spellings))),
]
found = 0
for base in ("src", "include/memtrain"):
    for folder, _, files in os.walk(os.path.join(root, base)):
        rel_folder = os.path.relpath(folder, os.path.join(root, base))
        if rel_folder == "model" or rel_folder.startswith("model/"):
            continue
        for name in sorted(files):
            if not name.endswith((".h", ".cpp", ".cu")):
                continue
            path = os.path.join(folder, name)
            for n, line in enumerate(open(path, errors="replace"), 1):
                code = line.split("//")[0]
                if any(t.search(code) for t in tests):
                    print("%s:%d: %s" % (os.path.relpath(path, root), n, line.strip()))
                    found += 1
print("%d model-name test(s) outside src/model/ (model spellings: %s)" % (found, ", ".join(spellings)))
sys.exit(1 if found else 0)
