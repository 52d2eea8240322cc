"""The wheels a bare GPU machine (no package registry) needs to run trainperf, fetched on a machine
that has one.

    # on the GPU machine: what its Python already has
    python3 -m pip list --format=freeze > present.txt
    # here (a registry reachable):
    python benchmarks/gpu_wheels.py --present present.txt --python-version 3.12 --out .whl
    # carry .whl and the repository there, then:
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=$PWD/src:/tmp/site
    python3 benchmarks/gpu_round.py --out round

trainperf's requirements (pyproject.toml, with --extras) that the GPU machine lacks are resolved for
its Python and platform, its installed versions pinned where `present` gives them (its torch and CUDA
libraries are kept as they are), and only what it lacks is downloaded, without dependencies (each is
listed). A package published
only as source is built here into a pure-Python wheel. `present` may list bare names (a package known
to be there, version unknown).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    raise SystemExit("benchmarks/gpu_wheels.py needs Python 3.11 or later (tomllib)") from None

REPO = Path(__file__).resolve().parents[1]
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "linux_x86_64")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_present(path: Path) -> dict[str, str | None]:
    """{normalised name: version or None} from `pip list --format=freeze` lines or bare names."""
    present: dict[str, str | None] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        if " @ " in name:  # an editable or direct-URL install: its version is unknown
            name = name.split(" @ ", 1)[0]
        present[normalise(name)] = version.strip() or None
    return present


def requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    reqs = list(project["dependencies"])
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for req in optional.get(extra, []):
            # An extra that names the project's own extras ("trainperf[recsys-cpu]") means their requirements:
            # the project itself runs from the source tree there.
            own = re.fullmatch(rf"{re.escape(project['name'])}\[([^\]]+)\]", req.strip())
            if own:
                pending += [e.strip() for e in own.group(1).split(",")]
            else:
                reqs.append(req)
    return reqs


def target_args(python_version: str) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def resolve(reqs: list[str], python_version: str) -> list[tuple[str, str]]:
    """(name, version) of every package the requirements need on the target."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
               str(report), "--target", str(Path(tmp) / "target"), *target_args(python_version), *reqs]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "pip failed"
            raise SystemExit(f"{' '.join(reqs)}: cannot resolve for the target ({last})")
        data = json.loads(report.read_text())
    return [(item["metadata"]["name"], item["metadata"]["version"]) for item in data["install"]]


def fetch(name: str, version: str, python_version: str, out: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(out),
                           *target_args(python_version), f"{name}=={version}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}=={version}: cannot download ({done.stderr.strip()[-300:]})")


def build_pure(requirement: str, out: Path) -> tuple[str, list[str]]:
    """A package published only as source, built here into a wheel, which is right only for pure-Python
    packages (checked); returns the wheel's name and its own requirements."""
    import zipfile

    before = set(out.glob("*.whl"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), requirement],
                           capture_output=True, text=True)
    new = sorted(set(out.glob("*.whl")) - before)
    if built.returncode != 0 or len(new) != 1 or not new[0].name.endswith("-none-any.whl"):
        raise SystemExit(f"{requirement}: no wheel for the target and no pure-Python build "
                         f"({built.stderr.strip()[-300:]})")
    with zipfile.ZipFile(new[0]) as wheel:
        meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        lines = wheel.read(meta).decode().splitlines()
    deps = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    return new[0].name, [d for d in deps if "extra ==" not in d]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--present", type=Path, required=True,
                        help="what the GPU machine's Python has: `pip list --format=freeze` output, or bare names")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default: 3.12)")
    parser.add_argument("--extras", default="test", help="pyproject extras to include (default: test)")
    parser.add_argument("--skip", default="ruff", help="requirements to leave out (default: ruff: no linting there)")
    parser.add_argument("--out", type=Path, default=Path(".whl"))
    args = parser.parse_args(argv)
    present = read_present(args.present)
    extras = [e for e in args.extras.split(",") if e]
    args.out.mkdir(parents=True, exist_ok=True)

    def lacking(reqs: list[str]) -> list[str]:
        # Requirements the machine meets by name keep its versions: resolving torch again would drag in
        # its CUDA libraries.
        return [r for r in reqs if normalise(re.match(r"[A-Za-z0-9._-]+", r).group(0)) not in present]

    skipped = {normalise(name) for name in args.skip.split(",") if name}
    queue = [r for r in lacking(requirements(extras)) if normalise(re.match(r"[A-Za-z0-9._-]+", r).group(0))
             not in skipped]
    binary: list[str] = []
    while queue:
        req = queue.pop(0)
        try:
            resolve([req], args.python_version)
            binary.append(req)
        except SystemExit:  # no wheel for the target: published as source only
            wheel, deps = build_pure(req, args.out)
            print(f"{wheel}: built here (pure Python, published as source only)")
            queue += [d for d in lacking(deps) if d not in binary and d not in queue]
    needed = resolve(binary, args.python_version) if binary else []
    # torch's CUDA libraries under another CUDA's names (nvidia-cublas-cu12 beside its nvidia-cublas) and
    # triton come with a dependency that names torch: the machine's torch brings its own.
    kept = ("nvidia-", "triton", "torch") if "torch" in present else ()
    missing = [(name, version) for name, version in needed
               if normalise(name) not in present and not normalise(name).startswith(kept)]
    for name, version in missing:
        fetch(name, version, args.python_version, args.out)
        print(f"{name}=={version}: wheel")
    total = sum(p.stat().st_size for p in args.out.glob("*.whl"))
    print(f"{args.out}: {len(list(args.out.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB")
    print(f"there: python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site {args.out}/*.whl "
          "&& export PYTHONPATH=$PWD/src:/tmp/site")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
