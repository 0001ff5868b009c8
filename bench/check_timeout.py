"""Issue 8's acceptance check for time limits: `dlverify check-jax
examples/models/llama3.py --timeout 1` must exit 3 in every run, within 3 s of
the limit. Usage: python bench/check_timeout.py [RUNS] [TIMEOUT]; prints each
run's exit code and wall time, exits 1 if any run misses."""
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    limit = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    cmd = [sys.executable, "-m", "dlverify.cli", "check-jax", "examples/models/llama3.py",
           "--timeout", f"{limit:g}"]
    bad = 0
    times = []
    for i in range(runs):
        t0 = time.monotonic()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        secs = time.monotonic() - t0
        times.append(secs)
        ok = p.returncode == 3 and secs <= limit + 3 and "Traceback" not in p.stderr
        bad += not ok
        print(f"run {i + 1}: exit {p.returncode}, {secs:.2f}s {'ok' if ok else 'MISS'}  "
              f"{p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}")
    print(f"{runs - bad}/{runs} exited 3 within {limit:g}+3 s; wall time min {min(times):.2f}s, "
          f"max {max(times):.2f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
