"""The `captions/` cases of the damaged-input corpus (damaged_inputs.py
calls add(its module) for its helpers: case, Refused, Accepted, need,
write, png_bytes).

An open_clip CsvDataset CSV (tab-separated, a header, the image path and
caption columns `filepath` and `title`) with one damaged row, run through
`memtrain convert-captions --images-root imgs`. The rows span a quoted
caption of two lines, so a damaged row's line (the physical line where it
starts, the header is line 1) is not its row number plus one. The
accepted case checks /captions and /images (8 x 8 PNGs at --size 8: the
resize is the identity) with h5py.
"""
import os

import h5py
import numpy as np

OUT = "out/p.h5"
# (path under imgs/, caption); the first caption spans lines 2-3, so the
# rows start on lines 2, 4 and 5.
ROWS = [("a.png", "two lines:\nthe second, \"quoted\""),
        ("b.png", "two cats on a mat"),
        ("sub/c.png", "a plain caption")]
SEEDS = {"a.png": 11, "b.png": 12, "sub/c.png": 13, "../outside.png": 14}


def field(s):
    """s as pandas reads it back: quoted when it holds a tab, a line break
    or a quote."""
    return '"' + s.replace('"', '""') + '"' if any(ch in s for ch in '\t\n\r"') else s


def csv_text(rows, header="filepath\ttitle"):
    return header + "\n" + "".join(f"{p}\t{field(c)}\n" for p, c in rows)


def add(m):
    def images(d):
        for p, seed in SEEDS.items():
            m.write(os.path.join(d, "imgs", p), m.png_bytes(8, 8, seed))

    def argv(ctx):
        return ["convert-captions", "--csv", "caps.csv", "--images-root", "imgs",
                "--out", OUT, "--size", "8"]

    def refused(name, text, *fields):
        """caps.csv is `text` (bytes or str): refused naming it and fields."""
        def build(d):
            images(d)
            m.write(os.path.join(d, "caps.csv"),
                    text if isinstance(text, bytes) else text.encode())
        m.case("captions/" + name, build, argv,
               m.Refused("caps.csv", *fields, outputs=[OUT]))

    good = csv_text(ROWS)
    # Row b.png starts on line 4.
    refused("nul-in-path", good.replace("b.png\t", "a.png\0b.png\t").encode(),
            r"\bline 4\b", r"filepath", r"NUL")
    refused("nul-in-caption", good.replace("two cats", "two\0cats").encode(),
            r"\bline 4\b", r"title", r"NUL")
    # The quote opened on line 4 is not closed there; pandas closes it at the
    # next quote (line 5) and the rows between join the caption.
    refused("unclosed-quote",
            csv_text(ROWS[:1]) + 'b.png\t"two cats\nsub/c.png\ta "plain" caption\n',
            r"\bline 4\b", r"title", r"quot")
    refused("missing-caption", good.replace("b.png\ttwo cats on a mat", "b.png"),
            r"\bline 4\b", r"title")
    refused("empty-caption", good.replace("two cats on a mat", ""),
            r"\bline 4\b", r"title")
    refused("duplicate-column",
            "filepath\ttitle\ttitle\n" + "".join(
                f"{p}\t{field(c)}\t{field(c)}\n" for p, c in ROWS),
            r"\bline 1\b", r"title")
    refused("dotdot-path", good.replace("b.png\t", "../outside.png\t"),
            r"\bline 4\b", r"filepath", r"--images-root")

    # Accepted: a byte order mark, \r\n line ends, a blank line, a quoted
    # caption with a tab, a line break and doubled quotes, a path with ..
    # that stays below the root, and an absolute path (read as written).
    def ok_build(d):
        images(d)
        rows = [("a.png", ROWS[0][1]),
                ("sub/../b.png", "tab\there, \"doubled\" quotes"),
                (os.path.join(d, "imgs", "sub", "c.png"), "an absolute path"),
                ("a.png", "a second caption of a.png")]
        lines = ["filepath\ttitle"] + [f"{p}\t{field(c)}" for p, c in rows]
        lines.insert(3, "")
        m.write(os.path.join(d, "caps.csv"), ("\ufeff" + "\r\n".join(lines) + "\r\n").encode())
        want = [("a.png", rows[0][1]), ("b.png", rows[1][1]), ("sub/c.png", rows[2][1]),
                ("a.png", rows[3][1])]
        return {"want": want}

    def ok_check(d, ctx, out, err):
        want = ctx["want"]
        with h5py.File(os.path.join(d, OUT), "r") as f:
            caps = [s.decode("utf-8") for s in f["captions"][:]]
            m.need(caps == [c for _, c in want], f"/captions {caps}, want {[c for _, c in want]}")
            x = f["images"][:]
            m.need(x.shape == (len(want), 3, 8, 8), f"/images {x.shape}")
            for i, (p, _) in enumerate(want):
                rng = np.random.default_rng(SEEDS[p])
                px = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8).transpose(2, 0, 1)
                m.need(np.array_equal(x[i], px), f"/images[{i}] is not {p}'s pixels")
            ids = f["pair_ids"][:].tolist()
            m.need("skipped" not in err, "a row was skipped")
            m.need(ids == [0, 1, 2, 0], f"/pair_ids {ids}, want [0, 1, 2, 0]")
    m.case("captions/ok-quoted-bom-crlf-absolute", ok_build, argv, m.Accepted(ok_check))
