"""peak_rss.py DIR -- COMMAND [ARGS...]: runs COMMAND (one rank, under
mpirun) and writes its peak resident set size in bytes (the kernel's
ru_maxrss of the waited-for child) to DIR/rank-<rank>; exits with its
status. The PyTorch side measures itself the same way (RUSAGE_SELF), so
the two peaks are the same measure: the largest resident set of a rank's
process."""

import os
import resource
import subprocess
import sys

if len(sys.argv) < 4 or sys.argv[2] != "--":
    sys.exit("usage: peak_rss.py DIR -- COMMAND [ARGS...]")
out = sys.argv[1]
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))
rc = subprocess.call(sys.argv[3:])
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"rank-{rank}"), "w") as f:
    f.write(f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}\n")
sys.exit(rc if rc >= 0 else 128 - rc)
