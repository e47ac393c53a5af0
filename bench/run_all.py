"""Run every benchmark in bench/ one after another (``make bench``); each prints its own table.

Timings on a shared 2-core machine are only as good as its quiet: the load average is printed before and
after each benchmark, so a table taken under load can be recognized (and rerun).
"""

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n=== {script.name} (load average {os.getloadavg()[0]:.2f}) ===", flush=True)
        start = time.perf_counter()
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent).returncode != 0:
            failed.append(script.name)
        took = time.perf_counter() - start
        print(f"=== {script.name}: {took:.0f} s, load average {os.getloadavg()[0]:.2f} ===", flush=True)
    sys.exit(f"failed: {failed}" if failed else 0)
