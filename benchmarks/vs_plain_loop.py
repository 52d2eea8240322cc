"""ResNet-50 (the full model, synthetic data): two hand-written loops against `trainperf bench` with the
same switches, for the same number of steps, alternated in one run (medians):
- the PyTorch ImageNet example's loop (fp32, default layout, eager): what a tutorial writes;
- the tuned peer: the same loop with bf16 autocast, channels-last, torch's fused SGD on a GPU and
  torch.compile where trainperf compiles: what a performance engineer writes by hand (on one H100 it
  ran at 5,646 img/s at batch 256 with compile, against trainperf's 5,264 then).

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

from trainperf import devices, registry
from trainperf.bench import throughput


def plain_loop(batch_size: int, steps: int, warmup: int, device: torch.device, image_size: int,
               tuned: bool = False, use_compile: bool = False, bf16: bool = True) -> float:
    """samples/s of the PyTorch ImageNet example's inner loop on random data (`tuned`: with bf16,
    channels-last, fused SGD on a GPU and, with `use_compile`, torch.compile)."""
    torch.manual_seed(0)
    model = torchvision.models.resnet50().to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    kind = {"fused": True} if (tuned and device.type == "cuda") else {"foreach": True} if tuned else {}
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4, **kind)
    images = torch.randn(batch_size, 3, image_size, image_size, device=device)
    target = torch.randint(0, 1000, (batch_size,), device=device)
    if tuned:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    forward = torch.compile(model) if (tuned and use_compile) else model
    model.train()
    for i in range(warmup + steps):
        if i == warmup:
            devices.synchronize(device)
            start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=tuned and bf16):
            output = forward(images)
        loss = criterion(output.float(), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    devices.synchronize(device)
    return batch_size * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when present)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3, help="alternating repetitions; medians are reported")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--compile", action="store_true", help="also torch.compile (default on a GPU)")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                        help="the tuned loop's and trainperf's (fp32 on a CPU without bf16 units: emulated bf16 "
                             "ran ~14x slower than fp32 on one)")
    args = parser.parse_args()
    device = devices.resolve(args.device)
    use_compile = args.compile or device.type == "cuda"

    workload = registry.get("resnet")
    switches = ["channels_last=true", f"precision={args.precision}", f"compile={'true' if use_compile else 'false'}",
                f"global_batch_size={args.batch_size}", f"image_size={args.image_size}", "optimizer=sgd",
                "base_lr=0.1", "weight_decay=1e-4", "label_smoothing=0.0"]
    if device.type == "cuda":
        switches.append("fused_optimizer=true")
    recipe = workload.recipe("full", "sgd-256").with_overrides(switches)
    plain, peer, ours = [], [], []
    for _ in range(args.reps):
        plain.append(plain_loop(args.batch_size, args.steps, args.warmup, device, args.image_size))
        peer.append(plain_loop(args.batch_size, args.steps, args.warmup, device, args.image_size, tuned=True,
                               use_compile=use_compile, bf16=args.precision == "bf16"))
        ours.append(throughput.run_bench(workload, recipe, "full", None, True, args.steps, args.warmup,
                                         str(device)).samples_per_s)
        print(f"plain loop {plain[-1]:8.1f}   tuned peer {peer[-1]:8.1f}   trainperf {ours[-1]:8.1f} samples/s",
              flush=True)
    p, q, o = statistics.median(plain), statistics.median(peer), statistics.median(ours)
    print(f"ResNet-50, batch {args.batch_size}, {args.image_size}px, {args.steps} steps after {args.warmup} warm-up, "
          f"{device}, medians of {args.reps}")
    names = ("channels_last", "precision", "compile", "fused_optimizer")
    label = ", ".join(s for s in switches if s.split("=")[0] in names)
    print(f"plain PyTorch loop (fp32, NCHW, eager): {p:.1f} samples/s")
    print(f"tuned hand-written loop ({label}): {q:.1f} samples/s")
    print(f"trainperf bench ({label}): {o:.1f} samples/s")
    print(f"trainperf / plain loop: {o / p:.2f}x; trainperf / tuned peer: {o / q:.2f}x")


if __name__ == "__main__":
    main()
