"""Throughput of the DLRM raw-TSV path: parsing + hashing + remapping to the binary layout, rows/s.

    python benchmarks/dlrm_preprocess.py                      # 4 days x 250,000 rows, 3 reps
    python benchmarks/dlrm_preprocess.py --rows-per-day 1000000 --reps 5

Day files are generated once (the mini generator, raw Criteo format with empty fields), then the
whole preprocessing runs `--reps` times from scratch, alternating one worker process and one per
core, so that machine noise hits both alike. Medians are printed last.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from trainperf.workloads.dlrm import data as D


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--rows-per-day", type=int, default=250_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trainperf-dlrm-bench-"))
    try:
        t0 = time.perf_counter()
        D.generate_days(root, args.days, args.rows_per_day)
        size = sum(D.day_file(root, d).stat().st_size for d in range(args.days))
        rows = args.days * args.rows_per_day
        print(f"generated {rows:,} rows ({size / 2**20:.0f} MiB of TSV) in {time.perf_counter() - t0:.1f} s")
        cores = os.cpu_count() or 1
        rates: dict[int, list[float]] = {1: [], cores: []}
        for rep in range(args.reps):
            for workers in rates:
                for split in D.SPLITS:
                    D.output_file(root, split).unlink(missing_ok=True)
                (root / D.MANIFEST).unlink(missing_ok=True)
                t = time.perf_counter()
                D.preprocess(root, args.days, say=lambda s: None, workers=workers)
                seconds = time.perf_counter() - t
                rates[workers].append(rows / seconds)
                print(f"rep {rep}: {workers} worker(s) {seconds:6.2f} s  {rows / seconds:10,.0f} rows/s")
        for workers, values in rates.items():
            print(f"preprocessing, {workers} worker process(es): median {statistics.median(values):,.0f} rows/s "
                  f"({statistics.median(values) * 3600 / 1e9:.2f} billion rows/hour; {size / rows:.0f} bytes/row)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
