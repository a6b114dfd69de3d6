"""Draws a PNG with gnuplot for the Python benchmarks (the C++ ones use
bench_common.h's bench::plot): the CSV stands alone when gnuplot is
missing or fails."""

import subprocess


def draw(script, png):
    """Runs gnuplot on `script` (which sets its own output to `png`)."""
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
