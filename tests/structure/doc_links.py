#!/usr/bin/env python3
"""Every relative Markdown link of the repository's tracked *.md files resolves.

A link `[text](target)` (or `![alt](target)`, or a reference definition
`[label]: target`) whose target is neither a URL (`scheme:`) nor absolute
must name a tracked file or a folder that holds tracked files, relative
to the file the link is in; a `#anchor` must match a heading of the
target Markdown file (or of the file itself, for a bare `#anchor`) as
GitHub makes its id: the heading's text as rendered (inline code,
emphasis and links reduced to their text), lower-cased, every character
but letters, digits, marks, ' ', '-' and '_' removed, spaces turned into
'-', and a heading whose id is taken gets '-1', '-2', ... Links inside
fenced code blocks and inline code are not links and are skipped
(indented code blocks are not told apart from indented text).

Each broken link is printed as FILE:LINE: target: reason, and the exit
status is 1; otherwise the number of links checked is printed and the
exit status is 0.

    python3 tests/structure/doc_links.py [ROOT]
"""
import os
import re
import subprocess
import sys
import unicodedata
import urllib.parse

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the text may hold one level of brackets.
INLINE = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFDEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def tracked_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"],
                         check=True, capture_output=True).stdout
    return [p for p in out.decode("utf-8").split("\0") if p]


def rendered_text(s):
    """A heading's Markdown source -> the text GitHub renders."""
    s = CODE_SPAN.sub(lambda m: m.group(2).strip(), s)
    s = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"<[^>]+>", "", s)                      # inline HTML tags
    s = re.sub(r"(\*\*|__)(.+?)\1", r"\2", s)           # strong
    s = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"\1", s)  # emphasis
    s = re.sub(r"(?<!\w)_(?!\s)(.+?)(?<!\s)_(?!\w)", r"\1", s)
    s = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", s)        # backslash escapes
    return s


def slug(text):
    out = []
    for ch in rendered_text(text).lower():
        if ch in " -_" or unicodedata.category(ch)[0] in "LMN":
            out.append(ch)
    return "".join(out).replace(" ", "-")


def scan(text):
    """Yields ('heading', line, text) and ('link', line, target) outside code."""
    lines = text.split("\n")
    fence = None
    prev = ""
    for i, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not line.strip()[len(m.group(1)):].strip():
                fence = None
            prev = ""
            continue
        if m:
            fence = m.group(1)
            prev = ""
            continue
        h = HEADING.match(line)
        if h:
            yield ("heading", i, h.group(2) or "")
        elif SETEXT.match(line) and prev.strip() and not prev.lstrip().startswith(("-", "*", "|", ">")):
            yield ("heading", i - 1, prev.strip())
        d = REFDEF.match(line) if not prev.strip() else None  # cannot interrupt a paragraph
        if d:
            yield ("link", i, d.group(2))
        bare = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in INLINE.finditer(bare):
            yield ("link", i, m.group(2))
        prev = line


def anchors_of(text):
    seen = {}
    out = set()
    for kind, _, value in scan(text):
        if kind != "heading":
            continue
        base = slug(value)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__.strip())
        return 0
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), "..", ".."))
    files = tracked_files(root)
    tracked = set(files)
    folders = set()
    for p in files:
        d = os.path.dirname(p)
        while d:
            folders.add(d)
            d = os.path.dirname(d)

    texts = {}

    def text_of(path):
        if path not in texts:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                texts[path] = f.read()
        return texts[path]

    broken = 0
    checked = 0
    for md in sorted(p for p in files if p.endswith(".md")):
        for kind, line, target in scan(text_of(md)):
            if kind != "link":
                continue
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            path = urllib.parse.unquote(path)
            if path.startswith("/"):
                why = "an absolute path (write it relative to this file)"
                print(f"{md}:{line}: {target}: {why}")
                broken += 1
                continue
            if path:
                resolved = os.path.normpath(os.path.join(os.path.dirname(md), path))
                resolved = "" if resolved == "." else resolved
                if resolved.startswith(".."):
                    print(f"{md}:{line}: {target}: leaves the repository")
                    broken += 1
                    continue
                if resolved not in tracked and resolved not in folders and resolved != "":
                    print(f"{md}:{line}: {target}: no tracked file or folder {resolved}")
                    broken += 1
                    continue
            else:
                resolved = md
            if anchor:
                if not resolved.endswith(".md") or resolved not in tracked:
                    continue  # anchors into other files (a line of code) are not checked
                if urllib.parse.unquote(anchor) not in anchors_of(text_of(resolved)):
                    print(f"{md}:{line}: {target}: {resolved} has no heading #{anchor}")
                    broken += 1
    if broken:
        print(f"{broken} broken link(s) of {checked} relative links in "
              f"{sum(p.endswith('.md') for p in files)} Markdown files")
        return 1
    print(f"{checked} relative links in {sum(p.endswith('.md') for p in files)} "
          f"Markdown files resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
