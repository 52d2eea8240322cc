"""Mini time-to-train over seeds: median/min/max of run_start -> run_stop, and how many reached the target.

    python benchmarks/mini_ttt.py resnet --runs 5
    python benchmarks/mini_ttt.py resnet --runs 10 --set base_lr=0.2     # calibrate a recipe change
    python benchmarks/mini_ttt.py resnet --runs 5 --vs-plain             # against a plain PyTorch loop
    python benchmarks/mini_ttt.py resnet --runs 10 --record              # calibrate: calibration.json, goldens.json

`--record` writes the calibration, and for the mini recipe itself the golden record of its first steps
(goldens.json) measured on the same code, its hash kept in the calibration. It refuses unless the second
test tier passed on this code (`python benchmarks/second_tier.py`, docs/testing.md).

`--vs-plain` (resnet) also trains a plain PyTorch loop, written the way the PyTorch tutorials do
(torchvision ImageFolder + DataLoader over the same JPEG folder, a small CNN, Adam), to the same
target on the same val split, for the same seeds, alternating with trainperf runs so that machine
noise hits both alike. Its clock starts where run_start is (before the data is opened).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from trainperf import jobs, registry
from trainperf.contract import RuntimeContext
from trainperf.harness import RunConfig, run


def trainperf_run(workload, recipe, data_dir: Path, seed: int) -> tuple[float, bool, int | None]:
    ctx = RuntimeContext.create("cpu")
    result = run(RunConfig(workload=workload, recipe=recipe, scale="mini", data_dir=data_dir, seed=seed,
                           log_path=None), ctx)
    curve = " ".join(f"{e.epoch:g}:{e.value:.3f}" if isinstance(e.value, float) else
                     f"{e.epoch:g}:(" + ", ".join(f"{k} {v:.3f}" for k, v in e.value.items()) + ")"
                     for e in result.evaluations)
    print(f"  evaluations (epoch:quality) {curve}", flush=True)
    reached = result.samples_to_target if recipe.log_epoch_num == "samples" else result.epochs_to_target
    return result.time_to_train_s, result.status == "success", reached


def plain_loop(data_dir: Path, target: float, seed: int, max_epochs: int = 12) -> tuple[float, bool, int | None]:
    """A tutorial-style loop: ImageFolder + ToTensor + Normalize, small CNN, Adam, eval every epoch."""
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,) * 3, (0.5,) * 3)])
    train = DataLoader(datasets.ImageFolder(data_dir / "train", tf), batch_size=64, shuffle=True)
    val = DataLoader(datasets.ImageFolder(data_dir / "val", tf), batch_size=512)
    for epoch in range(1, max_epochs + 1):
        model.train()
        for x, y in train:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in val:
                correct += (model(x).argmax(1) == y).sum().item()
                total += len(y)
        if correct / total >= target:
            return time.perf_counter() - start, True, epoch
    return time.perf_counter() - start, False, None


def summary(name: str, rows: list[tuple[float, bool, int | None]]) -> str:
    times = [t for t, _, _ in rows]
    ok = sum(1 for _, s, _ in rows if s)
    epochs = [e for _, _, e in rows]
    return (f"{name:>10}: median {statistics.median(times):6.2f} s  min {min(times):6.2f}  max {max(times):6.2f}"
            f"  reached {ok}/{len(rows)}  epochs {epochs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--vs-plain", action="store_true", help="also time a plain PyTorch loop (resnet)")
    parser.add_argument("--record", action="store_true",
                        help="write the result into trainperf's calibration file (src/trainperf/calibration.json), "
                             "replacing the entry of the same workload and settings")
    parser.add_argument("--note", default="", help="a remark kept with the recorded calibration")
    args = parser.parse_args()

    workload = registry.get(args.workload)
    recipe = workload.recipe("mini").with_overrides(args.set)
    data_dir = jobs.prepared_data(workload, "mini", None)  # generated and recorded on first use
    golden = None
    if args.record:
        from trainperf.bench import goldens, tiers

        tiers.require_second_tier_passed()  # a calibration is recorded only on code the second tier passed
        if not args.set and workload.golden is not None:
            golden = goldens.measure(workload, data_dir)  # its first steps, on the code calibrated below
    ours, plain = [], []
    for seed in range(args.first_seed, args.first_seed + args.runs):
        ours.append(trainperf_run(workload, recipe, data_dir, seed))
        line = f"seed {seed}: trainperf {ours[-1][0]:6.2f} s ({'ok' if ours[-1][1] else 'MISSED'})"
        if args.vs_plain:
            plain.append(plain_loop(data_dir, recipe.target, seed, recipe.max_epochs))
            line += f"   plain loop {plain[-1][0]:6.2f} s ({'ok' if plain[-1][1] else 'MISSED'})"
        print(line, flush=True)
    print(f"{args.workload} mini time-to-train (run_start -> run_stop), {args.runs} seeds, target "
          f"{recipe.target}, {torch.get_num_threads()} threads")
    print(summary("trainperf", ours))
    if plain:
        print(summary("plain loop", plain))
        ratio = statistics.median(t for t, _, _ in plain) / statistics.median(t for t, _, _ in ours)
        print(f"speed vs plain loop (median plain / median trainperf): {ratio:.2f}x")
    if args.record:
        record(workload, recipe, args, ours, golden)


def _range(values: list) -> str:
    found = sorted(v for v in values if v is not None)
    if not found:
        return "-"
    text = [f"{v:,.0f}" if v >= 1000 else f"{v:g}" for v in (found[0], found[-1])]
    return text[0] if text[0] == text[1] else f"{text[0]}–{text[1]}"


def record(workload, recipe, args, rows: list[tuple[float, bool, int | None]], golden: dict | None) -> None:
    import datetime
    import shlex

    from trainperf import calibration
    from trainperf.bench import goldens
    from trainperf.runtime import environment

    times = [t for t, _, _ in rows]
    reached = [t for t, ok, _ in rows if ok]
    unit = "samples" if recipe.log_epoch_num == "samples" else "epochs"
    entry = calibration.Calibration(
        workload=workload.name, target=calibration.target_text(workload.metric, recipe.target),
        seeds=len(rows), reached=len(reached), median_s=round(statistics.median(times), 2),
        min_s=round(min(reached), 2) if reached else None, max_s=round(max(reached), 2) if reached else None,
        progress=f"{_range([e for _, ok, e in rows if ok])} {unit}",
        date=datetime.date.today().isoformat(), machine=environment.platform_name(torch.device("cpu")),
        command=shlex.join(["python", "benchmarks/mini_ttt.py", workload.name, "--runs", str(args.runs),
                            *[x for s in args.set for x in ("--set", s)]]),
        sets=list(args.set), nproc=1, note=args.note)
    if golden is not None:
        # The golden record and the calibration are written together, from the same code.
        digest = goldens.record(workload.name, golden)
        entry = dataclasses.replace(entry, goldens_sha256=digest, goldens_note="measured with this calibration")
        print(f"golden record {digest} recorded in {goldens.PATH}")
    calibration.record(entry)
    print(f"recorded in {calibration.PATH}")


if __name__ == "__main__":
    main()
