"""Time and memory of the RNN-T transducer loss: trainperf's wavefront loss (anti-diagonals, analytic
gradient) against the straightforward loop over (t, u) vectorised over the batch (autograd gradient).

    python benchmarks/transducer_loss.py                       # mini and full shapes, both losses
    python benchmarks/transducer_loss.py --shapes full --repeats 3

Each case runs in a fresh process: forward + backward of the loss from joint logits that require a
gradient, median of --repeats timed runs after one warm-up; peak memory is the process's peak
resident size (CPU) or torch's peak allocation (CUDA) above what it held once the logits existed.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

SHAPES = {"mini": (8, 20, 5, 50), "full": (16, 500, 100, 1024)}  # (batch, T, U, classes)


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def one_case(shape: str, kind: str, repeats: int, device: str) -> dict:
    import torch

    from trainperf.workloads.rnnt.loss import transducer_loss, transducer_loss_loop

    b, t, u, v = SHAPES[shape]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b, t, u + 1, v, generator=g).to(device).requires_grad_()
    targets = torch.randint(0, v - 1, (b, u), generator=g).to(device)
    frames = torch.full((b,), t, device=device)
    labels = torch.full((b,), u, device=device)
    fn = {"wavefront": lambda: transducer_loss(logits, targets, frames, labels, v - 1),
          "loop": lambda: transducer_loss_loop(logits, targets, frames, labels, v - 1).mean()}[kind]
    cuda = device.startswith("cuda")
    base = torch.cuda.memory_allocated() if cuda else rss_bytes()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(repeats + 1):
        logits.grad = None
        start = time.perf_counter()
        fn().backward()
        if cuda:
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"shape": shape, "kind": kind, "ms": 1e3 * statistics.median(times), "peak_extra_gib": (peak - base) / 2**30,
            "logits_gib": logits.numel() * 4 / 2**30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="mini,full")
    parser.add_argument("--kinds", default="wavefront,loop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        shape, kind = args.case.split(":")
        print(json.dumps(one_case(shape, kind, args.repeats, args.device)))
        return
    rows = []
    for shape in args.shapes.split(","):
        for kind in args.kinds.split(","):
            done = subprocess.run([sys.executable, __file__, "--case", f"{shape}:{kind}", "--repeats",
                                   str(args.repeats), "--device", args.device], capture_output=True, text=True)
            if done.returncode:
                print(f"{shape} {kind}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{shape:5s} B,T,U,V={SHAPES[shape]}  {kind:9s}  {r['ms']:10.1f} ms/batch (fwd+bwd)  "
                  f"peak +{r['peak_extra_gib']:.2f} GiB (logits {r['logits_gib']:.2f} GiB)", flush=True)
    for shape in args.shapes.split(","):
        got = {r["kind"]: r for r in rows if r["shape"] == shape}
        if {"wavefront", "loop"} <= set(got):
            print(f"{shape}: wavefront {got['loop']['ms'] / got['wavefront']['ms']:.1f}x faster than the loop, "
                  f"{got['loop']['peak_extra_gib'] / max(got['wavefront']['peak_extra_gib'], 1e-9):.1f}x less "
                  "extra memory")


if __name__ == "__main__":
    main()
