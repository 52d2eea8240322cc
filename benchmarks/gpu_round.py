"""A GPU round in one command, for whoever has a GPU for a few minutes.

    python benchmarks/gpu_round.py --out DIR [--budget-min 9] [--sections env,bench,syncs,graphs] [--remeasure]

Within the budget (sections in order of value; one that no longer fits is recorded as skipped):
  env     the device, driver and software versions
  bench   every workload at full scale on synthetic data with the best eager switches, and a torch.profiler
          table of its top operators by device and by host time: all in one process (benchmarks/bench_worker.py),
          in the ledger's order (docs/gpu/ledger.json: never measured on this GPU model first, then the oldest;
          what is unchanged since, same code, GPU model and torch, is skipped unless --remeasure)
  energy  a ResNet mini trained to its target with --power nvml,rapl (--power-optional): its energy from NVML
          (and the CPUs' where powercap is readable), the GPUs' energy counters beside the readings
  syncs   the sync audit (benchmarks/sync_audit.py, one process): each workload's step as the counter counts
          it and as torch reports it under set_sync_debug_mode("warn"), with where each synchronisation is
  graphs  every workload offering --cuda-graphs: eager -> --compile -> --cuda-graphs (static shapes where its
          batches vary), one process per workload capped at twice its last compile time, fastest first;
          torch.compile's cache artifacts carried from round to round (docs/gpu/cache/GPU-TORCH, hits reported)
  tests   the GPU-only tests (python -m pytest -m gpu, on the files that hold them)
  nccl    a launched group of one on the GPU (torchrun --nproc_per_node 1): NCCL, DDP, the collectives
  ladder  ResNet-50 full, synthetic, batch 256: fp32 -> channels-last -> bf16 -> fused optimizer ->
          compile -> CUDA Graphs, one `bench` per rung (throughput, step time, memory, MFU)
  counts  benchmarks/step_ops.py on the device: operators, synchronisations, host time per step
  pipeline the full ResNet-50 input pipeline on an ImageNet-like JPEG folder (benchmarks/imagenet_like.py):
          the data share of the step with decoding in DataLoader workers and on the device
  peers   the hand-written loops on the same device: ResNet-50 (benchmarks/vs_plain_loop.py) and
          Hugging Face BERT (benchmarks/bert_peer.py)
  fp8     BERT with --precision fp8 --compile (torchao's float8 training)
  suite   the mini suite on the device (the fast minis unless --suite-all)
Writes DIR/round.json and DIR/round.md (device, versions, every command and its figures) after each
section, DIR/details.tar.gz (every command's output and JSON), DIR/ledger.json (the ledger with this round's
measurements: `python benchmarks/gpu_ledger.py --merge DIR/ledger.json` takes them into docs/gpu/ledger.json)
and DIR/compile-cache/ (commit it as docs/gpu/cache/GPU-TORCH/ where it fits the carry limits). The README's
"GPU round" section says how to run it on a bare GPU machine (the wheels to carry).

On a CPU (`--device cpu --quick`) every section runs at toy sizes: tests/test_gpu_round.py checks
the summary's format and one workload's profile that way.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_ledger  # noqa: E402 - benchmarks/gpu_ledger.py, beside this script

# In order of value: what was never measured first (the bench section puts it first within), then the sync audit,
# the compile ladders (fast compiles first), then what earlier rounds measured.
SECTIONS = ("env", "bench", "energy", "syncs", "graphs", "tests", "nccl", "ladder", "counts", "pipeline", "peers",
            "fp8", "suite")


def probes() -> dict[str, Any]:
    """name -> what one GPU benchmarks of its full scale: each workload's own declaration
    (Workload.device_probe: NVIDIA's per-GPU batch where published, and what makes it fit one 80 GB GPU)."""
    from trainperf import registry

    found = {name: registry.get(name).device_probe for name in registry.names()}
    return {name: probe for name, probe in found.items() if probe is not None}


# The ladder: each rung adds one switch to the one before.
LADDER = (("fp32", []), ("+ channels-last", ["--channels-last"]), ("+ bf16", ["--precision", "bf16"]),
          ("+ fused optimizer", ["--fused-optimizer"]), ("+ compile", ["--compile"]),
          ("+ CUDA Graphs (instead of compile)", ["--cuda-graphs"]))
FAST_MINIS = "resnet,ncf,dlrm,ssd,transformer,gnmt,bert,unet3d"
# Seconds each section needs at least (below that it is skipped), and may take at most.
# The graphs section: each workload that offers CUDA Graphs, eager, then compiled, then recorded as CUDA Graphs
# (with static shapes where its batches vary: --cuda-graphs turns them on), at the bench section's batch.
# Then, where a workload offers them: its repeated blocks compiled one by one (kept where it stays within ~2 % of
# the whole model compiled, at a fraction of the compile time), and CUDA Graphs recorded without Inductor (no
# kernel compilation: for the workloads Inductor takes minutes to compile).
GRAPH_RUNGS = (("eager", []), ("compile", ["--compile"]), ("regional compile", ["--compile", "--regional-compile"]),
               ("CUDA Graphs", ["--cuda-graphs"]),
               ("CUDA Graphs without Inductor", ["--cuda-graphs", "--graphs-backend", "cudagraphs"]))
MIN_S = {"env": 5, "energy": 30, "tests": 60, "nccl": 30, "syncs": 60, "ladder": 60, "bench": 60, "graphs": 60,
         "counts": 60, "pipeline": 60, "peers": 60, "fp8": 60, "suite": 60}
MAX_S = {"env": 30, "energy": 120, "tests": 240, "nccl": 120, "syncs": 180, "ladder": 270, "bench": 300,
         "graphs": 300, "counts": 150, "pipeline": 180, "peers": 240, "fp8": 180, "suite": 480}


class Round:
    def __init__(self, out: Path, budget_s: float, device: str, quick: bool, remeasure: bool = False,
                 ledger: Path = gpu_ledger.LEDGER) -> None:
        self.out, self.device, self.quick, self.remeasure = out, device, quick, remeasure
        self.ledger = gpu_ledger.load(ledger)
        self.codes: dict[str, str] = {}
        # torch.compile's cache artifacts: the committed ones (docs/gpu/cache) are copied here at the start and
        # every worker loads and saves here, so that they come back with the round's files.
        self.cache = out / "compile-cache"
        self.deadline = time.monotonic() + budget_s
        self.started = time.monotonic()
        self.details: dict[str, bytes] = {}
        self.summary: dict[str, Any] = {
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device, "quick": quick, "budget_s": budget_s, "sections": []}

    # -- running commands ---------------------------------------------------------------------------
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, argv: list[str], timeout: float, env: dict[str, str] | None = None,
            shown: str | None = None) -> dict[str, Any]:
        """One command: exit code, seconds, output tail; its whole output kept for details.tar.gz."""
        t0 = time.monotonic()
        timeout = max(1.0, min(timeout, self.left()))
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        try:
            done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=full_env)
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            code = "timeout"
            partial = exc.stdout or ""
            output = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
            output += f"\n[stopped after {timeout:.0f} s: the round's time was up]"
        self.details[f"{name}.txt"] = output.encode()
        command = shown or shlex.join(["python" if a == sys.executable else a.replace(f"{REPO}/", "")
                                       for a in argv])
        return {"name": name, "command": command, "exit": code, "seconds": round(time.monotonic() - t0, 1),
                "tail": output.strip().splitlines()[-6:]}

    def trainperf(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "trainperf", *args]

    def json_of(self, path: Path) -> Any:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        self.details[path.name] = path.read_bytes()
        return data

    # -- bookkeeping ------------------------------------------------------------------------------
    def section(self, name: str, runner: Any, last: bool = False) -> None:
        """One section under its cap; the last one asked for takes what is left (caps protect later ones)."""
        entry: dict[str, Any] = {"name": name}
        if self.left() < MIN_S[name]:
            entry.update(status="skipped", reason=f"{self.left():.0f} s of the budget left, needs {MIN_S[name]} s")
        else:
            t0 = time.monotonic()
            section_deadline = self.deadline if last else min(self.deadline, t0 + MAX_S[name])
            saved, self.deadline = self.deadline, section_deadline
            try:
                entry.update(runner())
                entry.setdefault("status", "ok")
            except Exception as exc:  # noqa: BLE001 - a broken section must not lose the others
                entry.update(status="error", reason=f"{type(exc).__name__}: {exc}")
            finally:
                self.deadline = saved
            entry["seconds"] = round(time.monotonic() - t0, 1)
        self.summary["sections"].append(entry)
        self.write()

    def write(self) -> None:
        self.summary["wall_s"] = round(time.monotonic() - self.started, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "round.json").write_text(json.dumps(self.summary, indent=1))
        (self.out / "round.md").write_text(markdown(self.summary))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for name, data in sorted(self.details.items()):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        (self.out / "details.tar.gz").write_bytes(buffer.getvalue())

    # -- the sections ---------------------------------------------------------------------------------
    def env(self) -> dict[str, Any]:
        code = ("import json, torch; from trainperf import devices; from trainperf.runtime import environment; "
                f"d = devices.resolve({self.device!r}); e = environment.describe(d); "
                "e['versions_cuda'] = devices.versions(); "
                "e['memory_gib'] = round(devices.total_memory(d) / 2**30, 1) if d.type == 'cuda' else None; "
                "print(json.dumps(e))")
        ran = self.run("env", [sys.executable, "-c", code], 60,
                       shown="python -c '<trainperf.runtime.environment.describe of the device>'")
        env = json.loads(ran["tail"][-1]) if ran["exit"] == 0 else {}
        smi = self.run("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                      "--format=csv,noheader"], 20) if self.device != "cpu" else None
        if smi and smi["exit"] == 0:
            env["nvidia_smi"] = smi["tail"]
        self.summary["environment"] = env
        return {"commands": [ran] + ([smi] if smi else []), "status": "ok" if env else "error"}

    def tests(self) -> dict[str, Any]:
        # By file: collecting the whole suite (1,300 tests) to run the few GPU ones cost a lent GPU a minute.
        files = gpu_test_files()
        ran = self.run("tests", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                 "-n", "0", "--durations=0", *files], self.left())
        last = ran["tail"][-1] if ran["tail"] else ""
        counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)", last)}
        return {"commands": [ran], "results": counts,
                "status": "ok" if ran["exit"] == 0 else "failed"}

    def nccl(self) -> dict[str, Any]:
        run_dir = self.out / "work" / "nccl"
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m",
                "trainperf", "run", "resnet", "--device", self.device, "--seed", "0", "--quiet", "--out", str(run_dir)]
        ran = self.run("nccl", argv, self.left())
        result = self.json_of(run_dir / "result.json") or {}
        env = result.get("environment", {})
        results = {"status": result.get("status"), "backend": env.get("backend"),
                   "time_to_train_s": result.get("time_to_train_s"), "device": env.get("device")}
        return {"commands": [ran], "results": results,
                "status": "ok" if ran["exit"] == 0 and result.get("status") == "success" else "failed"}

    def _bench(self, name: str, workload: str, args: list[str]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        path = self.out / "work" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        ran = self.run(name, self.trainperf("bench", workload, "--device", self.device, *args, "--json", str(path)),
                       self.left())
        return ran, self.json_of(path) if ran["exit"] == 0 else None

    def ladder(self) -> dict[str, Any]:
        batch, steps, warmup = ("2", "2", "1") if self.quick else ("256", "20", "5")
        rows, commands, switches = [], [], []
        for label, added in LADDER:
            if added == ["--cuda-graphs"]:
                switches = [s for s in switches if s != "--compile"] + added
            else:
                switches = switches + added
            if self.device == "cpu" and ("--cuda-graphs" in added or ("--compile" in added and self.quick)):
                rows.append({"rung": label, "skipped": "needs a GPU" if "--cuda-graphs" in added else "quick"})
                continue
            ran, result = self._bench(f"ladder-{len(rows)}", "resnet", [
                "--scale", "full", "--synthetic", "--batch-size", batch, "--steps", steps, "--warmup", warmup,
                *switches])
            commands.append(ran)
            rows.append({"rung": label, **_bench_row(result)} if result else {"rung": label, **_unfinished(ran)})
        return {"commands": commands, "results": rows,
                "status": "ok" if all("failed" not in r for r in rows) else "failed"}

    # -- the ledger: what was measured before, and what comes first ------------------------------------------
    def gpu(self) -> str:
        env = self.summary.get("environment", {})
        return (env.get("gpus") or [self.device])[0]

    def torch_version(self) -> str:
        """The environment section's torch, else this process's (the same interpreter runs every section): an
        environment section stopped on a loaded machine must not make the whole ledger look stale."""
        found = self.summary.get("environment", {}).get("versions", {}).get("torch")
        if found:
            return found
        import torch

        return torch.__version__

    def planned(self, keys: list[str]) -> list[gpu_ledger.Planned]:
        codes = {k: self.codes.setdefault(k.split("/")[1], gpu_ledger.fingerprint(k.split("/")[1])) for k in keys}
        return gpu_ledger.plan(keys, self.ledger, self.gpu(), self.torch_version(), codes)

    def measured(self, entry_key: str, row: dict[str, Any], seconds: float | None) -> None:
        """A measurement into the round's ledger ($OUT/ledger.json: `gpu_ledger.py --merge` takes it in)."""
        workload = entry_key.split("/")[1]
        gpu_ledger.record(self.ledger, entry_key, row, commit=self.summary.get("environment", {}).get("git_sha") or
                          "unknown", gpu=self.gpu(), torch=self.torch_version(),
                          date=self.summary["started"][:10], code=self.codes.get(workload), seconds=seconds)
        gpu_ledger.save(self.ledger, self.out / "ledger.json")

    def committed_cache(self) -> Path:
        """The compile cache committed for this GPU model and torch version (docs/gpu/cache/KIND-TORCH)."""
        return REPO / "docs" / "gpu" / "cache" / f"{gpu_ledger.gpu_kind(self.gpu())}-{self.torch_version()}"

    def worker(self, name: str, jobs: list[dict[str, Any]], timeout: float) -> tuple[dict[str, Any], Path]:
        """`jobs` (trainperf commands) in one process (benchmarks/bench_worker.py), with the compile cache."""
        if not self.cache.exists():
            self.cache.mkdir(parents=True)
            committed = self.committed_cache()
            for path in sorted(committed.glob("*.bin")) if committed.is_dir() else []:
                (self.cache / path.name).write_bytes(path.read_bytes())
        folder = self.out / "work" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "jobs.json").write_text(json.dumps(jobs))
        ran = self.run(name, [sys.executable, str(REPO / "benchmarks" / "bench_worker.py"), str(folder / "jobs.json"),
                              "--cache", str(self.cache)], timeout,
                       shown=f"python benchmarks/bench_worker.py ({len(jobs)} trainperf commands in one process)")
        for job in jobs:
            if (folder / f"{job['name']}.txt").is_file():
                self.details[f"{job['name']}.txt"] = (folder / f"{job['name']}.txt").read_bytes()
        report = self.json_of(folder / "cache.json")
        if report:
            self.summary.setdefault("compile_cache", []).append({"worker": name, **report})
        return ran, folder

    def job_result(self, folder: Path, name: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """A worker job's result JSON (None: it failed or did not run) and its exit and seconds."""
        try:
            done = json.loads((folder / f"{name}.done.json").read_text())
        except (OSError, ValueError):
            return None, {"exit": "timeout", "seconds": None}
        result = self.json_of(folder / f"{name}.json") if done["exit"] == 0 else None
        return result, done

    def bench(self) -> dict[str, Any]:
        """Every workload's eager bench in one process, in the ledger's order: never measured on this GPU model
        first, then the oldest; the unchanged skipped (--remeasure measures them too)."""
        rows, jobs, order = [], [], []
        declared = probes()
        workloads = self.summary.get("workloads") or list(declared)
        for planned in self.planned([gpu_ledger.key("bench", w) for w in workloads]):
            workload = planned.key.split("/")[1]
            if planned.unchanged and not self.remeasure:
                rows.append({"workload": workload, "skipped": planned.reason})
                continue
            spec = declared[workload]
            batch = "2" if self.quick else str(spec.batch)
            steps, warmup, profile = ("1", "1", "1") if self.quick else ("10", "3", "3")
            args = ["--scale", "full", "--synthetic", "--batch-size", batch, "--steps", steps, "--warmup", warmup,
                    "--profile", profile, "--precision", "bf16", *spec.switches]
            args += _supported_switches(workload)
            for item in spec.sets:
                args += ["--set", item]
            if self.quick:
                from trainperf import registry

                for item in registry.get(workload).step_probe:
                    if not item.startswith("global_batch_size"):
                        args += ["--set", item]
            path = self.out / "work" / "bench" / f"bench-{workload}.json"
            jobs.append({"name": f"bench-{workload}", "argv": ["bench", workload, "--device", self.device, *args,
                                                               "--json", str(path)]})
            order.append((workload, planned))
        if not jobs:
            return {"commands": [], "results": rows, "status": "ok"}
        ran, folder = self.worker("bench", jobs, self.left())
        for workload, planned in order:
            result, done = self.job_result(folder, f"bench-{workload}")
            row = {"workload": workload, "why": planned.reason}
            if result:
                row.update(_bench_row(result), profile=result.get("profile"))
                self.measured(gpu_ledger.key("bench", workload), row, done["seconds"])
            else:  # a job the worker never finished: the round's budget stopped it
                row.update(_unfinished({"exit": done["exit"], "seconds": done["seconds"] or ran["seconds"]}))
            rows.append(row)
        return {"commands": [ran], "results": rows,
                "status": "ok" if all("failed" not in r for r in rows) else "failed"}

    def graphs(self) -> dict[str, Any]:
        """Each workload offering CUDA Graphs: eager, compiled, graphed, in one process per workload (a hung
        compile costs its cap, not the round); the fastest compiles first by the ledger's times, the unknown
        next, the slowest last, each capped at twice its last time."""
        from trainperf import registry

        rows, commands = [], []
        declared = probes()
        workloads = [w for w in (self.summary.get("workloads") or list(declared))
                     if "cuda_graphs" in registry.get(w).speedups]
        compiles = self.planned([gpu_ledger.key("graphs", w, "compile") for w in workloads])
        known = {p.key.split("/")[1]: p for p in compiles}
        workloads.sort(key=lambda w: (known[w].seconds is None, known[w].seconds or 0.0))
        slow = [w for w in workloads if (known[w].seconds or 0) > gpu_ledger.UNKNOWN_COMPILE_S]
        workloads = [w for w in workloads if w not in slow] + slow
        for workload in workloads:
            spec = declared[workload]
            batch = "2" if self.quick else str(spec.batch)
            base = ["--scale", "full", "--synthetic", "--batch-size", batch, "--steps", "1" if self.quick else "10",
                    "--warmup", "1" if self.quick else "3", "--precision", "bf16", *_supported_switches(workload)]
            for item in spec.sets:
                base += ["--set", item]
            jobs, labels, unrunnable = [], [], []
            for label, added in GRAPH_RUNGS:
                if "--regional-compile" in added and "regional_compile" not in registry.get(workload).speedups:
                    continue
                if self.device == "cpu" and "--cuda-graphs" in added:
                    unrunnable.append({"workload": workload, "rung": label, "skipped": "needs a GPU"})
                    continue
                name = label.replace(" ", "-")
                path = self.out / "work" / f"graphs-{workload}" / f"{name}.json"
                jobs.append({"name": name, "argv": ["bench", workload, "--device", self.device, *base, *added,
                                                    "--json", str(path)]})
                labels.append(label)
            if self.left() < 20:
                rows += [{"workload": workload, "rung": label, "skipped": "budget"} for label in labels] + unrunnable
                continue
            cap = 60 + 2 * gpu_ledger.compile_cap(known[workload])
            ran, folder = self.worker(f"graphs-{workload}", jobs, min(cap, self.left()))
            commands.append(ran)
            for label, job in zip(labels, jobs, strict=True):
                result, done = self.job_result(folder, job["name"])
                row = {"workload": workload, "rung": label}
                if result:
                    row.update(_bench_row(result))
                    self.measured(gpu_ledger.key("graphs", workload, label), row, done["seconds"])
                else:
                    row.update(_unfinished({"exit": done["exit"], "seconds": done["seconds"] or ran["seconds"]}))
                rows.append(row)
            rows += unrunnable  # the rungs in the ladder's order: eager, compile, then CUDA Graphs
        return {"commands": commands, "results": rows,
                "status": "ok" if all("failed" not in r for r in rows) else "failed"}

    def syncs(self) -> dict[str, Any]:
        from trainperf import registry

        path = self.out / "work" / "syncs.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        planned = self.planned([gpu_ledger.key("syncs", w) for w in self.summary.get("workloads") or registry.names()])
        only = ",".join(p.key.split("/")[1] for p in planned if not p.unchanged or self.remeasure)
        if not only:
            return {"commands": [], "results": [], "status": "ok", "reason": "every workload unchanged"}
        ran = self.run("syncs", [sys.executable, str(REPO / "benchmarks" / "sync_audit.py"), "--device", self.device,
                                 "--only", only, "--json", str(path)], self.left())
        rows = self.json_of(path) or []
        for row in rows:
            if "error" not in row and "device" in row:
                self.measured(gpu_ledger.key("syncs", row["workload"]), row, row.get("seconds"))
        return {"commands": [ran], "results": rows, "status": "ok" if ran["exit"] == 0 else "failed"}

    def counts(self) -> dict[str, Any]:
        path = self.out / "work" / "counts.json"
        only = ",".join(self.summary.get("workloads") or probes())
        ran = self.run("counts", [sys.executable, str(REPO / "benchmarks" / "step_ops.py"), "--device", self.device,
                                  "--only", only, "--steps", "1", "--json", str(path)], self.left())
        return {"commands": [ran], "results": self.json_of(path) or [],
                "status": "ok" if ran["exit"] == 0 else "failed"}

    def pipeline(self) -> dict[str, Any]:
        folder = self.out / "work" / "imagenet-like"
        per_class, batch, steps = ("4", "4", "2") if self.quick else ("256", "256", "10")
        commands = [self.run("imagenet-like", [sys.executable, str(REPO / "benchmarks" / "imagenet_like.py"), "--out",
                                               str(folder), "--classes", "10", "--train-per-class", per_class,
                                               "--val-per-class", "2"], self.left())]
        rows = []
        for decode in ("workers", "device"):
            workers = str(min(16, os.cpu_count() or 1))
            ran, result = self._bench(f"pipeline-{decode}", "resnet", [
                "--scale", "full", "--data", str(folder), "--batch-size", batch, "--steps", steps, "--warmup", "2",
                "--precision", "bf16", "--channels-last", "--set", f"decode={decode}",
                "--set", f"num_workers={workers}"])
            commands.append(ran)
            rows.append({"decode": decode, **_bench_row(result)} if result else
                        {"decode": decode, **_unfinished(ran)})
        return {"commands": commands, "results": rows,
                "status": "ok" if all("failed" not in r for r in rows) else "failed"}

    def peers(self) -> dict[str, Any]:
        resnet = ["--batch-size", "4", "--steps", "2", "--warmup", "1"] if self.quick else \
            ["--batch-size", "256", "--steps", "30", "--warmup", "10"]
        bert = ["--batch-size", "2", "--seq", "64", "--predictions", "10", "--layers", "2", "--hidden", "128",
                "--heads", "2", "--steps", "2", "--warmup", "1"] if self.quick else \
            ["--batch-size", "32", "--steps", "10", "--warmup", "3"]
        commands = [self.run("peer-resnet", [sys.executable, str(REPO / "benchmarks" / "vs_plain_loop.py"), "--device",
                                             self.device, "--reps", "1", *resnet], self.left()),
                    self.run("peer-bert", [sys.executable, str(REPO / "benchmarks" / "bert_peer.py"), "--device",
                                           self.device, "--reps", "1", *bert], self.left())]
        lines = [line for ran in commands for line in ran["tail"] if ":" in line and ("/s" in line or "x" in line)]
        return {"commands": commands, "results": lines,
                "status": "ok" if all(ran["exit"] == 0 for ran in commands) else "failed"}

    def fp8(self) -> dict[str, Any]:
        sizes = ["--batch-size", "2", "--set", "max_seq_length=64", "--set", "max_predictions=10", "--set", "layers=2",
                 "--set", "hidden=128",
                 "--set", "heads=2", "--set", "intermediate=512", "--steps", "1", "--warmup", "1"] if self.quick else \
            ["--batch-size", "32", "--steps", "10", "--warmup", "3"]
        rows, commands = [], []
        for precision in ("bf16", "fp8"):
            extra = [] if self.quick else ["--compile"]
            ran, result = self._bench(f"fp8-{precision}", "bert", ["--scale", "full", "--synthetic", "--precision",
                                                                   precision, "--packing", *extra, *sizes])
            commands.append(ran)
            rows.append({"precision": precision, **_bench_row(result)} if result else
                        {"precision": precision, **_unfinished(ran)})
        return {"commands": commands, "results": rows,
                "status": "ok" if all("failed" not in r for r in rows) else "failed"}

    def energy(self) -> dict[str, Any]:
        """The ResNet mini's energy to train from NVML (docs/power.md): never measured before on a GPU."""
        folder = self.out / "work" / "energy"
        workload = "ncf" if self.quick else "resnet"
        ran = self.run("energy", self.trainperf("run", workload, "--seed", "0", "--device", self.device, "--quiet",
                                                "--out", str(folder), "--power", "nvml,rapl", "--power-optional"),
                       self.left())
        result = self.json_of(folder / "result.json") or {}
        power = result.get("power") or {}
        if (folder / "power" / "power_node_0.png").is_file():
            self.details["energy-power.png"] = (folder / "power" / "power_node_0.png").read_bytes()
        row = {"workload": workload, "status": result.get("status"), "time_to_train_s": result.get("time_to_train_s"),
               "energy_j": power.get("energy_j"), "average_w": power.get("average_w"),
               "official_source": power.get("official_source"),
               "sources": {name: {k: v.get(k) for k in ("energy_j", "average_w", "samples", "max_gap_s",
                                                        "energy_counter_j", "error")}
                           for name, v in (power.get("sources") or {}).items()}}
        return {"commands": [ran], "results": row,
                "status": "ok" if ran["exit"] == 0 and power.get("energy_j") is not None else "failed"}

    def suite(self) -> dict[str, Any]:
        only = self.summary.get("suite_only") or FAST_MINIS
        folder = self.out / "work" / "suite"
        ran = self.run("suite", self.trainperf("suite", "--only", only, "--seed", "0", "--device", self.device,
                                               "--out", str(folder)), self.left())
        data = self.json_of(folder / "suite.json") or {}
        if (folder / "suite.md").is_file():
            self.details["suite.md"] = (folder / "suite.md").read_bytes()
        rows = [{k: r.get(k) for k in ("workload", "status", "reason", "score_minutes", "converged", "runs",
                                       "epochs_to_target", "samples_per_s", "wall_s")} for r in data.get("rows", [])]
        return {"commands": [ran], "results": rows, "status": "ok" if ran["exit"] == 0 else "failed"}


def gpu_test_files() -> list[str]:
    """The test files holding tests marked `gpu` (read from their text: no collection)."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                  if "mark.gpu" in p.read_text(encoding="utf-8"))


def _supported_switches(workload: str) -> list[str]:
    from trainperf import registry

    supported = registry.get(workload).speedups
    return [flag for name, flag in (("channels_last", "--channels-last"), ("fused_optimizer", "--fused-optimizer"))
            if name in supported]


def _unfinished(ran: dict[str, Any]) -> dict[str, Any]:
    """A command that left no result: stopped by the round's budget is not a failure of the workload."""
    if ran["exit"] == "timeout":
        return {"skipped": f"budget (stopped after {ran['seconds']:.0f} s)"}
    return {"failed": ran["exit"]}


def _bench_row(result: dict[str, Any] | None) -> dict[str, Any]:
    if not result:
        return {}
    keys = ("batch_size", "samples_per_s", "units_per_s", "units", "sample_name", "step_time_p50_ms",
            "peak_memory_mb", "peak_allocated_mb", "device_in_use_mb", "achieved_tflops", "mfu", "data_share",
            "warmup_s")
    return {k: result.get(k) for k in keys} | {"switches": {k: v for k, v in result.get("speedups", {}).items() if v
                                                              and v != "fp32"}}


# -- the Markdown summary ------------------------------------------------------------------------------
def _num(value: Any, fmt: str = ",.1f") -> str:
    return "-" if value is None else format(value, fmt)


def markdown(summary: dict[str, Any]) -> str:
    env = summary.get("environment", {})
    versions = env.get("versions", {})
    cuda = env.get("versions_cuda", {})
    lines = [f"# GPU round: {env.get('platform', summary['device'])}", "",
             f"Started {summary['started']}, {summary.get('wall_s', 0):.0f} s of wall time (budget "
             f"{summary['budget_s']:.0f} s){', quick sizes' if summary.get('quick') else ''}.", "",
             "| field | value |", "|---|---|"]
    for key, value in (("device", env.get("device")), ("GPU", ", ".join(env.get("gpus") or []) or "-"),
                       ("memory", f"{env['memory_gib']} GiB" if env.get("memory_gib") else "-"),
                       ("nvidia-smi", "; ".join(env.get("nvidia_smi") or []) or "-"),
                       ("CUDA / cuDNN / NCCL", " / ".join(str(cuda.get(k) or "-") for k in ("cuda", "cudnn", "nccl"))),
                       ("torch / torchvision", f"{versions.get('torch')} / {versions.get('torchvision')}"),
                       ("python", env.get("python")), ("CPU", f"{env.get('cpu')} ({env.get('cpu_count')} cores)"),
                       ("trainperf", f"{versions.get('trainperf')} at {env.get('git_sha')}"),
                       ("host", platform.node())):
        lines.append(f"| {key} | {value} |")
    for section in summary["sections"]:
        name = section["name"]
        lines += ["", f"## {name}: {section['status']}" + (f" ({section['reason']})" if section.get("reason") else "")
                  + (f", {section['seconds']:.0f} s" if "seconds" in section else "")]
        results = section.get("results")
        if name == "tests" and results is not None:
            lines.append(", ".join(f"{n} {kind}" for kind, n in results.items()) or "no result line")
        elif name == "energy" and results:
            ttt = _num(results.get("time_to_train_s"), ".2f")
            lines.append(f"{results.get('workload')} mini {results.get('status')} in {ttt} s: "
                         f"{_num(results.get('energy_j'), ',.0f')} J, {_num(results.get('average_w'))} W "
                         f"({results.get('official_source')})")
            for source, v in (results.get("sources") or {}).items():
                lines.append(f"- {source}: {_num(v.get('energy_j'), ',.0f')} J over the timed region, "
                             f"{v.get('samples')} samples, longest gap {_num(v.get('max_gap_s'), '.2f')} s"
                             + (f", energy counters {_num(v['energy_counter_j'], ',.0f')} J over the whole sampling"
                                if v.get("energy_counter_j") is not None else "")
                             + (f"; {v['error']}" if v.get("error") else ""))
        elif name == "nccl" and results:
            lines.append(f"run status {results['status']}, backend {results['backend']}, device {results['device']}, "
                         f"time-to-train {_num(results['time_to_train_s'], '.2f')} s")
        elif name == "ladder" and results:
            lines += ["| rung | samples/s | uplift | step p50 ms | peak memory MiB | tensors MiB | MFU |",
                      "|---|---|---|---|---|---|---|"]
            previous = None
            for r in results:
                if "samples_per_s" not in r:
                    lines.append(f"| {r['rung']} | {r.get('skipped') or 'failed'} | | | | | |")
                    continue
                uplift = f"{r['samples_per_s'] / previous:.2f}x" if previous else "-"
                previous = r["samples_per_s"]
                lines.append(f"| {r['rung']} | {_num(r['samples_per_s'])} | {uplift} "
                             f"| {_num(r['step_time_p50_ms'], '.2f')} "
                             f"| {_num(r['peak_memory_mb'], ',.0f')} | {_num(r['peak_allocated_mb'], ',.0f')} "
                             f"| {_num((r['mfu'] or 0) * 100, '.1f')} % |")
        elif name == "graphs" and results:
            # The warm-up's seconds are what compiling (and recording) cost: what regional compilation saves.
            lines += ["| workload | rung | samples/s | against eager | step p50 ms | warm-up s |",
                      "|---|---|---|---|---|---|"]
            eager: dict[str, float] = {}
            for r in results:
                if "samples_per_s" not in r:
                    lines.append(f"| {r['workload']} | {r['rung']} | {r.get('skipped') or 'failed'} | | | |")
                    continue
                eager.setdefault(r["workload"], r["samples_per_s"])
                lines.append(f"| {r['workload']} | {r['rung']} | {_num(r['samples_per_s'])} "
                             f"| {r['samples_per_s'] / eager[r['workload']]:.2f}x "
                             f"| {_num(r['step_time_p50_ms'], '.2f')} | {_num(r.get('warmup_s'))} |")
        elif name == "bench" and results:
            lines += ["| workload | batch | throughput | step p50 ms | peak memory MiB | MFU | switches |",
                      "|---|---|---|---|---|---|---|"]
            for r in results:
                if "samples_per_s" not in r:
                    lines.append(f"| {r['workload']} | {r.get('skipped') or 'failed'} | | | | | |")
                    continue
                rate = f"{_num(r['samples_per_s'])} {r.get('sample_name') or 'samples'}/s"
                if r.get("units_per_s"):
                    rate += f" ({_num(r['units_per_s'], ',.0f')} {r['units']}/s)"
                lines.append(f"| {r['workload']} | {r['batch_size']} | {rate} | {_num(r['step_time_p50_ms'], '.2f')} "
                             f"| {_num(r['peak_memory_mb'], ',.0f')} | {_num((r['mfu'] or 0) * 100, '.1f')} % "
                             f"| {', '.join(f'{k}={v}' for k, v in r['switches'].items())} |")
            for r in results:
                profile = r.get("profile")
                if not profile:
                    continue
                lines += ["", f"### {r['workload']}: top operators per step ({profile['host_ms']:.1f} ms host, "
                              f"{profile['device_ms']:.1f} ms device)", ""]
                by_device, by_host = profile["by_device"][:6], profile["by_host"][:6]
                if by_device:
                    lines += ["| by device time | calls | device ms | | by host time | calls | host ms |",
                              "|---|---|---|---|---|---|---|"]
                else:  # no device (a CPU run): the host table alone
                    lines += ["| by host time | calls | host ms |", "|---|---|---|"]
                for i in range(max(len(by_device), len(by_host))):
                    d = by_device[i] if i < len(by_device) else None
                    h = by_host[i] if i < len(by_host) else None
                    right = f"{h['name'][:50]} | {h['calls']:g} | {h['host_ms']:.2f}" if h else " | | "
                    if by_device:
                        left = f"{d['name'][:50]} | {d['calls']:g} | {d['device_ms']:.2f}" if d else " | | "
                        lines.append(f"| {left} | | {right} |")
                    else:
                        lines.append(f"| {right} |")
        elif name == "syncs" and results:
            lines += ["| workload | syncs / step, counted | syncs / step, the device reports | where they differ |",
                      "|---|---|---|---|"]
            for r in results:
                if "error" in r:
                    lines.append(f"| {r['workload']} | failed: {r['error'][:80]} | | |")
                    continue
                differ = "" if r.get("agree", True) else "; ".join(
                    f"{n:g} x {site}" for site, n in list(r["device_sites"].items())[:3])
                lines.append(f"| {r['workload']} | {r['counted']:g} | {_num(r.get('device'), 'g')} | {differ} |")
        elif name == "counts" and results:
            lines += ["| workload | ops / step | kernels | syncs | host-data tensors | host ms | step ms |",
                      "|---|---|---|---|---|---|---|"]
            for r in results:
                lines.append(f"| {r['workload']} | {r['ops']:,.0f} | {r['kernels']:,.0f} | {r['sync_total']:g} "
                             f"| {r['host_data']:g} | {_num(r['host_ms'])} | {_num(r['step_ms'])} |")
        elif name in ("pipeline", "fp8") and results:
            key = "decode" if name == "pipeline" else "precision"
            lines += [f"| {key} | throughput | data share | step p50 ms | MFU |", "|---|---|---|---|---|"]
            for r in results:
                if "samples_per_s" not in r:
                    lines.append(f"| {r[key]} | {r.get('skipped') or 'failed'} | | | |")
                    continue
                lines.append(f"| {r[key]} | {_num(r['samples_per_s'])} {r.get('sample_name') or 'samples'}/s "
                             f"| {_num((r['data_share'] or 0) * 100, '.1f')} % | {_num(r['step_time_p50_ms'], '.2f')} "
                             f"| {_num((r['mfu'] or 0) * 100, '.1f')} % |")
        elif name == "peers" and results:
            lines += [f"    {line}" for line in results]
        elif name == "suite" and results:
            lines += ["| workload | status | time-to-train s | converged | epochs to target | samples/s | wall s |",
                      "|---|---|---|---|---|---|---|"]
            for r in results:
                ttt = None if r.get("score_minutes") is None else r["score_minutes"] * 60
                lines.append(f"| {r['workload']} | {r['status']}{': ' + r['reason'] if r.get('reason') else ''} "
                             f"| {_num(ttt)} | {r.get('converged')}/{r.get('runs')} | {r.get('epochs_to_target')} "
                             f"| {_num(r.get('samples_per_s'))} | {_num(r.get('wall_s'), '.0f')} |")
        for ran in section.get("commands", []):
            lines.append(f"- `{ran['command']}` → exit {ran['exit']}, {ran['seconds']} s")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--budget-min", type=float, default=9.0, help="the whole round's time (default: 9 minutes)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"a subset of {','.join(SECTIONS)}")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (toy run of the format)")
    parser.add_argument("--workloads", help="bench and counts only these (default: all)")
    parser.add_argument("--suite-all", action="store_true", help="every mini in the suite (default: the fast ones)")
    parser.add_argument("--quick", action="store_true", help="toy sizes (the CPU test of the format)")
    parser.add_argument("--ledger", type=Path, default=gpu_ledger.LEDGER,
                        help="what earlier rounds measured (default: docs/gpu/ledger.json)")
    parser.add_argument("--remeasure", action="store_true",
                        help="measure what the ledger (docs/gpu/ledger.json) says is unchanged too")
    args = parser.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {', '.join(unknown)} (choose from {', '.join(SECTIONS)})")
    workloads = args.workloads.split(",") if args.workloads else None
    declared = probes()
    if workloads and set(workloads) - set(declared):
        parser.error(f"--workloads: unknown {', '.join(sorted(set(workloads) - set(declared)))}")
    round_ = Round(args.out, args.budget_min * 60, args.device, args.quick, args.remeasure, args.ledger)
    round_.summary["workloads"] = workloads
    chosen = list(declared) if args.suite_all else workloads
    round_.summary["suite_only"] = ",".join(chosen) if chosen else None
    for i, name in enumerate(sections):
        round_.section(name, getattr(round_, name), last=i == len(sections) - 1)
        print(f"gpu round: {name} {round_.summary['sections'][-1]['status']} "
              f"({round_.summary['sections'][-1].get('seconds', 0):.0f} s)", flush=True)
    print(f"wrote {args.out / 'round.md'}, {args.out / 'round.json'}, {args.out / 'details.tar.gz'}")
    failed = [s["name"] for s in round_.summary["sections"] if s["status"] in ("failed", "error")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
