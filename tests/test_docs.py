"""The docs stay true: every relative link and anchor resolves, the generated tables are up to date,
the smallest complete workload of docs/adding-a-workload.md runs through the harness to its target
and its log passes the official checker, and CI runs the README's test command."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from tests.conftest import read_log
from trainperf.contract import RuntimeContext
from trainperf.harness import RunConfig, run
from trainperf.results.compliance import check

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ADDING = ROOT / "docs" / "adding-a-workload.md"
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]


def _example() -> dict:
    text = ADDING.read_text(encoding="utf-8")
    match = re.search(r"<!-- example-workload -->\s*```python\n(.*?)```", text, re.S)
    assert match, "docs/adding-a-workload.md: the example workload block is missing"
    module = types.ModuleType("readme_example")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(match.group(1), str(ADDING), "exec"), module.__dict__)  # noqa: S102 - our own docs
    return module.__dict__


def test_the_example_workload_reaches_its_target(tmp_path):
    workload = _example()["Circles"]()
    recipe = workload.recipe("mini")
    assert workload.data_problems("mini", tmp_path)
    workload.prepare("mini", tmp_path, print)
    assert not workload.data_problems("mini", tmp_path)
    log = tmp_path / "log.txt"
    result = run(RunConfig(workload=workload, recipe=recipe, scale="mini", data_dir=tmp_path, seed=1, log_path=log),
                 RuntimeContext.create("cpu"))
    assert result.status == "success" and result.final_metric >= 0.95, result.abort_reason
    assert read_log(log)[-1]["metadata"]["status"] == "success"
    assert check(log).valid


def test_ci_runs_the_readme_test_command():
    text = README.read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(pip install [^\n]*pytest[^\n]*)\n```", text)
    assert commands, "README: no test command in a bash block"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[0] in ci.splitlines()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*?|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_the_slugs_are_githubs():
    assert _slug("trainperf run") == "trainperf-run"
    assert _slug("Throughput on one GPU, against NVIDIA's and a hand-written loop's") == \
        "throughput-on-one-gpu-against-nvidias-and-a-hand-written-loops"
    assert _slug("ResNet-50 v1.5 (`resnet`)") == "resnet-50-v15-resnet"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # external: not checked offline
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_the_index():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    for page in DOCS[1:]:
        rel = page.relative_to(ROOT / "docs").as_posix()
        assert rel == "README.md" or f"({rel})" in index, f"docs/README.md does not link {rel}"


def test_the_generated_tables_are_up_to_date(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import make_docs
    finally:
        sys.path.pop(0)
    assert make_docs.main(["--check"]) == 0, capsys.readouterr().out + " (run python benchmarks/make_docs.py)"


def test_the_readme_stays_a_front_page():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


@pytest.mark.slow
@pytest.mark.parametrize("name, sets, bounded", [
    ("llama31_8b", ["max_samples=256", "eval_every_samples=256"], True),
    ("flux1", ["max_samples=256", "eval_every_samples=256", "eval_samples=256"], True),
    ("ncf", ["max_epochs=1"], False)])
@pytest.mark.second_tier
def test_a_log_stopped_short_of_its_target_fails_only_the_rules_that_bound_a_value(tmp_path, name, sets, bounded):
    """docs/commands.md (exit 130) says what the log of a run stopped after its first evaluation passes: every
    rule of the official checker but those bounding an evaluation's value (issue 60, 14: it said "passes
    the official checker", false for interrupted llama31_8b and flux1 logs). Held to it on real runs cut
    short (aborted by their budget: the same records as an interrupted run's), and the docs name the
    workloads whose rules bound a value."""
    import json

    from trainperf.cli import main

    out = tmp_path / "run"
    argv = ["run", name, "--out", str(out), "--quiet", "--seed", "0", *[x for s in sets for x in ("--set", s)]]
    assert main(argv) == 1
    assert json.loads((out / "result.json").read_text())["evaluations"]
    verdict = check(out / "mlperf_log.txt", None)  # each workload's ruleset
    complaints = [line for line in verdict.output.splitlines() if line.startswith("WARNING")]
    assert all("Failed checks for" in line and ("eval_accuracy" in line or "averaged_validation_loss" in line)
               for line in complaints), complaints
    assert verdict.valid is not bounded, verdict.output
    said = " ".join((ROOT / "docs" / "commands.md").read_text().split()).split("| 130 |")[1].split(" |")[0]
    assert (f"`{name}`" in said) is bounded, said
