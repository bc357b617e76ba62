"""Wall time of the command line's quick answers: ``--help``, an argument error, a user error.

Each case runs ``python -m gnnact ...`` in a fresh process (as a user types it), ``--repeats``
times; the row has the median and the largest wall time in seconds, the exit status and
whether stderr held a traceback. ``--help`` and argparse's errors load neither torch nor PyG
(the target is under 2 s); a user error found after loading (an unknown dataset) pays the
imports once. ``import torch`` alone is timed too, for scale.

Usage::

    python benchmarks/bench_cli.py [--repeats 5] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import RESULTS, ROOT, environment, finish

CASES = {
    "help": ["-m", "gnnact", "--help"],
    "train_help": ["-m", "gnnact", "train", "--help"],
    "argument_error": ["-m", "gnnact", "--bits", "9"],
    "unknown_dataset": ["-m", "gnnact", "--dataset", "no-such-graph"],
    "import_torch": ["-c", "import torch"],
}


def run(argv: list[str]) -> tuple[float, int, bool]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    return time.perf_counter() - start, proc.returncode, "Traceback" in proc.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per case")
    parser.add_argument("--out", type=Path, default=RESULTS / "cli.jsonl", help="rows file")
    parser.add_argument("--smoke", action="store_true", help="one run each, no rows written")
    args = parser.parse_args(argv)
    repeats = 1 if args.smoke else args.repeats
    env = environment("cpu")
    rows = []
    for case, case_argv in CASES.items():
        runs = [run(case_argv) for _ in range(repeats)]
        seconds = [s for s, _, _ in runs]
        rows.append({"bench": "cli", **env, "case": case, "argv": case_argv,
                     "repeats": repeats, "median_s": statistics.median(seconds),
                     "max_s": max(seconds), "exit_code": runs[0][1],
                     "traceback": any(t for _, _, t in runs)})
        print(f"{case:>16}: median {rows[-1]['median_s']:.2f} s, max {max(seconds):.2f} s, "
              f"exit {runs[0][1]}")
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
