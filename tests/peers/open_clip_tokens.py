#!/usr/bin/env python3
"""open_clip's token ids for captions: the reference of convert-captions.

Usage: open_clip_tokens.py CAPTIONS.json OUT.json [--context-length L]
CAPTIONS.json holds a JSON list of strings; OUT.json gets, for each, the
row of open_clip.tokenize([caption], context_length=L) (L ints, zero
padded). Importable: tokens(captions, L). Needs open_clip (the torch venv:
launch/install_peers.sh).
"""
import argparse
import json
import sys


def tokens(captions, context_length=77):
    import open_clip
    return open_clip.tokenize(list(captions), context_length=context_length).tolist()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("captions")
    p.add_argument("out")
    p.add_argument("--context-length", type=int, default=77)
    a = p.parse_args()
    import open_clip
    print(f"open_clip {open_clip.__version__}", file=sys.stderr)
    with open(a.captions, encoding="utf-8") as f:
        caps = json.load(f)
    with open(a.out, "w") as f:
        json.dump(tokens(caps, a.context_length), f)


if __name__ == "__main__":
    main()
