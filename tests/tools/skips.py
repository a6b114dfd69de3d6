#!/usr/bin/env python3
"""Every skip of the test command's ctest runs, from their JUnit files
(ctest --output-junit, with the passed tests' whole output): a table of
each skip and its reason, and exit 1 when one is for want of something the
test command installs itself.

A skip says why in one line, and of which kind:
- a script prints `SKIP (machine): WHY` for what this machine cannot give
  (a GPU, root, network namespaces, a writable memory cgroup), `SKIP
  (build): WHY` for what this configuration is built without (the CPU
  build's *_CUDA tests), and `SKIP: WHY` for anything else;
- a gtest skip's message starts with "(machine) " or "(build) " likewise;
- a ctest entry skipped (SKIP_RETURN_CODE) without such a line is a skip
  that says nothing, which fails as well.

Only the first two kinds are allowed: the test command installs every
other prerequisite (launch/install_deps.sh, launch/install_peers.sh,
launch/install_torch.sh), so a test that skips for one found a broken
install, and passing it green would hide a test that compared nothing.

usage: skips.py LABEL=JUNIT.xml [LABEL=JUNIT.xml ...]
Standard library only.
"""

import re
import sys
import xml.etree.ElementTree as ET

ALLOWED = ("machine", "build")
SCRIPT = re.compile(r"^SKIP(?: \((\w+)\))?: (.*)$")
GTEST_AT = re.compile(r": Skipped$")
GTEST_END = re.compile(r"^\[  SKIPPED \] (\S+) \(\d+ ms\)$")
KIND = re.compile(r"^\((\w+)\) (.*)$")
# Colour codes (gtest colours its lines under mpirun), as written and as
# ctest's JUnit file spells their escape character.
COLOUR = re.compile(r"(?:\x1b|\[NON-XML-CHAR-0x1B\])\[[0-9;]*m")


def skips_of(output):
    """(subtest, kind, reason) for each skip line in one test's output."""
    found, message = [], None
    for raw in output.splitlines():
        line = COLOUR.sub("", raw).strip()
        m = SCRIPT.match(line)
        if m:
            found.append(("", m.group(1) or "other", m.group(2)))
            continue
        if GTEST_AT.search(line):
            message = []
            continue
        m = GTEST_END.match(line)
        if m and message is not None:
            text = " ".join(message).strip()
            k = KIND.match(text)
            found.append((m.group(1), k.group(1), k.group(2)) if k else (m.group(1), "other", text))
            message = None
            continue
        if message is not None:
            message.append(line)
    return found


def rows_of(label, path):
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        out = case.findtext("system-out") or ""
        found = skips_of(out)
        if case.get("status") == "notrun" and not found:
            why = case.find("skipped")
            found = [("", "unexplained", why.get("message") if why is not None else "not run")]
        for sub, kind, reason in found:
            row = (label, name + (f" ({sub})" if sub else ""), kind, reason)
            if row not in rows:  # every rank of an MPI test prints its own
                rows.append(row)
    return rows


def main(argv):
    if not argv or any("=" not in a for a in argv):
        sys.exit("usage: skips.py LABEL=JUNIT.xml [LABEL=JUNIT.xml ...]")
    rows = []
    for a in argv:
        label, path = a.split("=", 1)
        try:
            rows += rows_of(label, path)
        except (OSError, ET.ParseError) as e:
            sys.exit(f"skips.py: cannot read {path} ({e}): run ctest with --output-junit")
    if not rows:
        print("skips: none (no test skipped, in whole or in part)")
        return 0
    head = ("configuration", "test", "kind", "reason")
    width = [max(len(r[i]) for r in rows + [head]) for i in range(3)]
    print(f"skips: {len(rows)} (allowed: {', '.join(ALLOWED)}; every other kind fails the test command)")
    for r in [head] + rows:
        print("  " + "  ".join(r[i].ljust(width[i]) for i in range(3)) + "  " + r[3])
    bad = [r for r in rows if r[2] not in ALLOWED]
    if bad:
        print(
            f"skips.py: {len(bad)} skip(s) for want of what the test command installs: "
            + "; ".join(f"{r[1]} ({r[0]}): {r[3]}" for r in bad)
            + ". Run launch/install_deps.sh and launch/install_peers.sh, or mend what they installed:"
            " only what the machine cannot give (kind machine) or the build leaves out (kind build) may skip.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
