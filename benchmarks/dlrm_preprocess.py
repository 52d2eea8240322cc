"""Throughput of the DLRM raw-TSV path: parsing + hashing + remapping to the binary layout, rows/s.

    python benchmarks/dlrm_preprocess.py                      # 4 days x 250,000 rows, 3 reps
    python benchmarks/dlrm_preprocess.py --rows-per-day 1000000 --reps 5
    python benchmarks/dlrm_preprocess.py --gzip --workers 1   # day_N.gz (as downloaded) vs day_N

Day files are generated once (the mini generator, raw Criteo format with empty fields), then the
whole preprocessing runs `--reps` times from scratch, alternating one worker process and one per
core, so that machine noise hits both alike. With `--gzip` it alternates the plain day files with the
same files gzip-compressed (as Criteo Terabyte is downloaded) instead. Medians are printed last.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from trainperf.workloads.dlrm import data as D
from trainperf.workloads.dlrm import mini as G


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--rows-per-day", type=int, default=250_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--gzip", action="store_true", help="compare day_N.gz with plain day files")
    parser.add_argument("--workers", type=int, default=1, help="worker processes with --gzip")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trainperf-dlrm-bench-"))
    try:
        t0 = time.perf_counter()
        G.generate_days(root, args.days, args.rows_per_day)
        size = sum(D.day_file(root, d).stat().st_size for d in range(args.days))
        rows = args.days * args.rows_per_day
        print(f"generated {rows:,} rows ({size / 2**20:.0f} MiB of TSV) in {time.perf_counter() - t0:.1f} s")
        cores = os.cpu_count() or 1
        if args.gzip:
            packed = root / "gz"
            packed.mkdir()
            for d in range(args.days):
                with D.day_file(root, d).open("rb") as src, gzip.open(packed / f"day_{d}.gz", "wb", 6) as dst:
                    shutil.copyfileobj(src, dst)
            gz_size = sum((packed / f"day_{d}.gz").stat().st_size for d in range(args.days))
            print(f"gzip level 6: {gz_size / 2**20:.0f} MiB")
            folders = {"plain": root, "gzip": packed}
        else:
            folders = {f"{w} worker(s)": root for w in (1, cores)}
        rates: dict[str, list[float]] = {name: [] for name in folders}
        for rep in range(args.reps):
            for name, folder in folders.items():
                workers = args.workers if args.gzip else int(name.split()[0])
                for split in D.SPLITS:
                    D.output_file(folder, split).unlink(missing_ok=True)
                (folder / D.MANIFEST).unlink(missing_ok=True)
                t = time.perf_counter()
                D.preprocess(folder, args.days, say=lambda s: None, workers=workers)
                seconds = time.perf_counter() - t
                rates[name].append(rows / seconds)
                print(f"rep {rep}: {name} {seconds:6.2f} s  {rows / seconds:10,.0f} rows/s")
        for name, values in rates.items():
            print(f"preprocessing, {name}: median {statistics.median(values):,.0f} rows/s "
                  f"({statistics.median(values) * 3600 / 1e9:.2f} billion rows/hour; {size / rows:.0f} bytes/row)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
