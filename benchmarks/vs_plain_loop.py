"""ResNet-50 (the full model, synthetic data): a plain training loop written like the PyTorch ImageNet
example (fp32, default layout, no compile) against `trainperf bench` with its best switches, for
the same number of steps, side by side in one run. Prints both throughputs and the ratio last.

    python benchmarks/vs_plain_loop.py --batch-size 32 --steps 10 --warmup 3
    python benchmarks/vs_plain_loop.py --device cuda --batch-size 256 --steps 50 --warmup 10

Best switches: channels-last + bf16 on a CPU (compile on request: --compile); on a GPU also compile.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchvision
from torch import nn

from trainperf import registry
from trainperf.bench import throughput


def plain_loop(batch_size: int, steps: int, warmup: int, device: torch.device, image_size: int) -> float:
    """samples/s of the PyTorch ImageNet example's inner loop on random data."""
    torch.manual_seed(0)
    model = torchvision.models.resnet50().to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    images = torch.randn(batch_size, 3, image_size, image_size, device=device)
    target = torch.randint(0, 1000, (batch_size,), device=device)
    model.train()
    for i in range(warmup + steps):
        if i == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return batch_size * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3, help="alternating repetitions; medians are reported")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--compile", action="store_true", help="also torch.compile (default on a GPU)")
    args = parser.parse_args()
    device = torch.device(args.device)
    use_compile = args.compile or device.type == "cuda"

    workload = registry.get("resnet")
    switches = ["channels_last=true", "precision=bf16", f"compile={'true' if use_compile else 'false'}",
                f"global_batch_size={args.batch_size}", f"image_size={args.image_size}", "optimizer=sgd",
                "base_lr=0.1", "weight_decay=1e-4", "label_smoothing=0.0"]
    if device.type == "cuda":
        switches.append("fused_optimizer=true")
    recipe = workload.recipe("full", "sgd-256").with_overrides(switches)
    plain, ours = [], []
    for _ in range(args.reps):
        plain.append(plain_loop(args.batch_size, args.steps, args.warmup, device, args.image_size))
        ours.append(throughput.run_bench(workload, recipe, "full", None, True, args.steps, args.warmup,
                                         args.device).samples_per_s)
        print(f"plain loop {plain[-1]:8.1f} samples/s   trainperf {ours[-1]:8.1f} samples/s", flush=True)
    p, o = statistics.median(plain), statistics.median(ours)
    print(f"ResNet-50, batch {args.batch_size}, {args.image_size}px, {args.steps} steps after {args.warmup} warm-up, "
          f"{device}, medians of {args.reps}")
    print(f"plain PyTorch loop (fp32, NCHW, eager): {p:.1f} samples/s")
    names = ("channels_last", "precision", "compile", "fused_optimizer")
    label = ", ".join(s for s in switches if s.split("=")[0] in names)
    print(f"trainperf bench ({label}): {o:.1f} samples/s")
    print(f"trainperf / plain loop: {o / p:.2f}x")


if __name__ == "__main__":
    main()
