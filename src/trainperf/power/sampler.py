"""The power sampler: a process of its own beside the training processes, so that reading meters (an
ipmitool call takes ~50-200 ms) never takes time from a training step or holds its GIL.

    python -m trainperf.power.sampler --out READINGS.csv --interval 1.0 --parent PID SOURCE [SOURCE ...]

It reads every source on a fixed schedule (tick k at start + k * interval, never drifting), appends one line
per reading, `tick,time_ms,source,watts`, flushed at once (a killed sampler leaves whole lines), and prints
`ready` once the first tick is written. It stops on SIGTERM/SIGINT, or by itself when the process that
started it is gone.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

from trainperf.power.sources import Nvml, Source, Unavailable, open_live, parse_specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("sources", nargs="+")
    args = parser.parse_args(argv)
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.append(True))
    sources: list[Source] = []
    with open(args.out, "a", encoding="utf-8") as out:
        for spec in parse_specs(",".join(args.sources)):
            try:
                sources.append(open_live(spec))
            except Unavailable as exc:
                out.write(f"# unavailable,{spec.name},{exc}\n")
        if not sources:
            out.flush()
            return 3  # nothing to read: the starting process says why, from the lines above
        _counters(sources, out)
        start, tick, told = time.time(), 0, False
        while not stopping and os.getppid() == args.parent:
            for source in sources:
                try:
                    watts = source.read()
                except Exception as exc:  # noqa: BLE001 - one failed reading must not end the sampling
                    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    out.write(f"# failed,{source.spec.name},{why}\n")
                    continue
                if watts is not None:
                    out.write(f"{tick},{round(time.time() * 1000)},{source.spec.name},{watts:.3f}\n")
            out.flush()
            if not told:
                print("ready", flush=True)
                told = True
            tick += 1
            late = time.time() - (start + tick * args.interval)
            if late > args.interval:  # stalled (a loaded machine, a slow BMC): resume the schedule from now
                start += late
            time.sleep(max(0.0, start + tick * args.interval - time.time()))
        _counters(sources, out)
    for source in sources:
        source.close()
    return 0


def _counters(sources: list[Source], out: TextIO) -> None:
    """NVML's energy counters, at the start and the end: what the readings' sum can be checked against."""
    for source in sources:
        if isinstance(source, Nvml):
            joules = source.energy_counter_j()
            if joules is not None:
                out.write(f"-1,{round(time.time() * 1000)},{source.spec.name}#counter_j,{joules:.3f}\n")


if __name__ == "__main__":
    sys.exit(main())
