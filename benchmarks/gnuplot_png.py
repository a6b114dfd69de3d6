"""Draws a PNG with gnuplot for the Python benchmarks (the C++ ones use
bench_common.h's bench::plot): the CSV stands alone when gnuplot is
missing or fails."""

import subprocess


def draw(png, body, size="900,540"):
    """Draws `body` (gnuplot commands reading a comma-separated file) into
    `png`; names with underscores print as they are (noenhanced)."""
    script = (f"set terminal pngcairo size {size} noenhanced\nset output '{png}'\n"
              "set datafile separator ','\n" + body)
    try:
        p = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    except FileNotFoundError:
        print("# gnuplot not found (apt-get install gnuplot-nox); PNG not drawn")
        return False
    if p.returncode != 0:
        print(f"# gnuplot failed: {p.stderr.strip()[:300]}; PNG not drawn")
        return False
    print(f"# plot {png}")
    return True
