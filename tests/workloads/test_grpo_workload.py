"""qwen35_397b_grpo: the mini's tasks and their grading in the sandbox, the data sources, the recipes'
rules, the policy's files, and what the full scale refuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from trainperf.errors import TrainperfError
from trainperf.workloads.common.rl import r2e, sandbox
from trainperf.workloads.common.rl.rewards import SandboxRewarder
from trainperf.workloads.qwen35_397b_grpo import data, policy, tasks
from trainperf.workloads.qwen35_397b_grpo.recipes import FULL_RECIPES, MINI, validation_start


def test_every_bug_fails_its_tests_and_the_tasks_are_distinct() -> None:
    tasks.check_bugs_fail()
    every = tasks.specs()
    assert len(every) == 720 and len({s.statement for s in every}) == 720
    train, val = tasks.split_specs(tasks.VALIDATION, tasks.SPLIT_SEED)
    assert len(val) == tasks.VALIDATION and not {s.statement for s in train} & {s.statement for s in val}
    assert {s.kind for s in val} == set(range(len(tasks.KINDS)))


def test_the_written_rows_are_r2e_gym_rows_and_graded_in_the_sandbox(tmp_path: Path) -> None:
    """The right program resolves its task, the bug and a broken text do not: R2E-Gym's rule over the
    runner's summary, each program run in the sandbox pool."""
    source = data.GeneratedTasks()
    assert source.problems(tmp_path)
    source.prepare(tmp_path, lambda _: None)
    assert source.problems(tmp_path) == []
    assert source.eval_set(tmp_path) == (tmp_path / tasks.VAL_FILE, tasks.VALIDATION)
    val = data.read(tmp_path / tasks.VAL_FILE)
    assert all(isinstance(t, r2e.Task) and t.agent == tasks.AGENT for t in val)
    chosen = val[:3]
    specs = [tasks.spec_of(t) for t in chosen]
    texts = [(i, s.right + "\n") for i, s in enumerate(specs)] + [(i, s.bug + "\n") for i, s in enumerate(specs)]
    texts.append((0, "import os; os.system('ls')\n"))
    with sandbox.Pool(2) as pool:
        rewarder = SandboxRewarder(pool, chosen, str, tasks.solution_files)
        rewards = rewarder.grade(texts)
        assert rewards == [1.0] * 3 + [0.0] * 3 + [0.0]
        assert rewarder.grade(texts[:1]) == [1.0] and rewarder.runs == len(texts)  # graded once


def test_the_mini_never_writes_over_task_files_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / tasks.VAL_FILE).write_text("a user's file\n")
    with pytest.raises(TrainperfError, match="did not write"):
        data.GeneratedTasks().prepare(tmp_path, lambda _: None)
    assert (tmp_path / tasks.VAL_FILE).read_text() == "a user's file\n"


def test_the_full_source_prefers_the_curriculum_file(tmp_path: Path) -> None:
    source = data.R2EGymFiles()
    assert any(tasks.TRAIN_FILE in p for p in source.problems(tmp_path))
    for name in (tasks.TRAIN_FILE, tasks.CURRICULUM_FILE, tasks.VAL_FILE):
        (tmp_path / name).write_text("")
    assert source.problems(tmp_path) == []
    assert data.train_file(tmp_path).name == tasks.CURRICULUM_FILE
    with pytest.raises(TrainperfError, match="no tasks"):
        data.read(tmp_path / tasks.VAL_FILE)


@pytest.mark.parametrize("name", list(FULL_RECIPES))
def test_the_full_recipes_follow_the_closed_rules_formulas(name: str) -> None:
    recipe = FULL_RECIPES[name]
    gbs = recipe.global_batch_size
    recipe.validate()
    assert recipe.num_prompts_per_step * 16 == gbs and recipe.num_generations_per_prompt == 16
    assert abs(recipe.lr - 1e-6 * math.sqrt(gbs / 256)) < 1e-9
    assert abs(recipe.max_grad_norm - 0.125 * math.sqrt(256 / gbs)) < 1e-9
    assert recipe.eval_first_samples == gbs * math.ceil(2.5 + 3840 / gbs) == validation_start(gbs)
    assert recipe.eval_every_samples == gbs and recipe.grad_accum_steps == gbs // 8


def test_a_batch_that_is_not_prompts_times_generations_is_one_line() -> None:
    with pytest.raises(TrainperfError, match="num_prompts_per_step x num_generations_per_prompt"):
        MINI.with_overrides(["global_batch_size=100"]).validate()


def test_the_character_tokenizer_round_trips(tmp_path: Path) -> None:
    tokenizer = policy.char_tokenizer(tasks.ALPHABET)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    text = policy.Text(tmp_path)
    ids = text.encode(policy.prompt("pow 3 5") + "n**3+5\n")
    assert text.decode(ids) == "pow 3 5:n**3+5\n" and text.stop == ids[-1] and text.pad == 0
    assert text.decode(ids + [0, 0]) == "pow 3 5:n**3+5\n"
    (tmp_path / "tokenizer.json").write_text("{")
    with pytest.raises(TrainperfError, match="tokenizer.json"):
        policy.Text(tmp_path)


def test_the_shipped_policy_is_checked_against_its_manifest(tmp_path: Path) -> None:
    import shutil

    policy.verify_shipped(policy.PACKAGE)
    copy = tmp_path / "policy"
    shutil.copytree(policy.PACKAGE, copy)
    manifest = json.loads((copy / "base.json").read_text())
    manifest["sha256"]["tokenizer.json"] = "0" * 64
    (copy / "base.json").write_text(json.dumps(manifest))
    with pytest.raises(TrainperfError, match="SHA-256 differs"):
        policy.verify_shipped(copy)


def test_the_shipped_base_writes_the_bug_where_the_teacher_mostly_did() -> None:
    """What the mini's target rests on: at the validation temperature the base writes the right program
    for the kinds the teacher mostly got right, and the bug for the others."""
    from trainperf.workloads.common.llm.hf_qwen35 import Qwen35Checkpoint
    from trainperf.workloads.common.llm.qwen35 import Qwen35
    from trainperf.workloads.common.rl.engine import Sampling, TorchEngine

    model = Qwen35(MINI.model, MINI.max_sequence_length)
    Qwen35Checkpoint(policy.PACKAGE).load_into(model)
    text = policy.Text(policy.PACKAGE)
    every = [tasks.Spec(k, 3, 4) for k in range(len(tasks.KINDS))]
    out = TorchEngine(model, pad=text.pad).generate([text.encode(policy.prompt(s.statement)) for s in every],
                                                     Sampling(0.0, 1.0, 24, text.stop), torch.Generator())
    written = [text.decode(out.tokens[i, :int(out.lengths[i])].tolist()).strip() for i in range(len(every))]
    for spec, program in zip(every, written, strict=True):
        mostly_right = tasks.TEACHER_BUG_RATE[spec.kind] < 0.5
        assert program == (spec.right if mostly_right else spec.bug), (spec.statement, program)


def test_the_full_scale_refuses_what_is_not_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainperf.contract import RuntimeContext
    from trainperf.registry import get

    workload = get("qwen35_397b_grpo")
    recipe = workload.recipe("full")
    with pytest.raises(TrainperfError, match="FSDP2 with expert parallelism"):
        workload.build(recipe, RuntimeContext.create("cpu"), workload_assets(workload, recipe))
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(TrainperfError, match="apptainer"):
        workload.load_data(recipe, tmp_path, RuntimeContext.create("cpu"))
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: "/usr/bin/apptainer")
    with pytest.raises(TrainperfError, match="OpenHands agent"):
        workload.load_data(recipe, tmp_path, RuntimeContext.create("cpu"))


def workload_assets(workload, recipe):  # noqa: ANN001, ANN201 - a test helper
    from trainperf.contract import Assets

    return Assets(workload.assets(recipe, None))


def test_the_target_is_reached_only_above_it() -> None:
    """The rules say pass@4 > 0.69: a quality equal to the target does not reach it."""
    from trainperf.registry import get

    metric = get("qwen35_397b_grpo").metric
    assert metric.strict and not metric.reached(0.69, 0.69) and metric.reached(174 / 251, 0.69)
    assert metric.describe_target(0.69) == "> 0.69"


def test_the_recipes_are_the_rcps() -> None:
    """Each reference convergence point of rcps_qwen35_397b_grpo.json (6.1.0) is a recipe with its batch, rate,
    clip norm, prompts and accumulation."""
    import mlperf_logging

    rcps = json.loads((Path(mlperf_logging.__file__).parent / "rcp_checker" / "training_6.1.0"
                       / "rcps_qwen35_397b_grpo.json").read_text())
    found = {(p["BS"], p["Hyperparams"]["opt_base_learning_rate"], p["Hyperparams"]["opt_gradient_clip_norm"],
              p["Hyperparams"]["num_prompts_per_step"], p["Hyperparams"]["gradient_accumulation_steps"])
             for p in rcps.values()}
    ours = {(r.global_batch_size, r.lr, r.max_grad_norm, r.num_prompts_per_step, r.grad_accum_steps)
            for r in FULL_RECIPES.values()}
    assert {(b, round(lr, 15), round(c, 9), n, a) for b, lr, c, n, a in found} == {
        (b, round(lr, 15), round(c, 9), n, a) for b, lr, c, n, a in ours}


def test_a_short_mini_run_logs_the_grpo_keys(tmp_path: Path) -> None:
    """Two GRPO steps through the harness: the log carries the rules' keys with the mini's values (the golden
    test runs the official checker's open rules on the mini's log)."""
    from tests.conftest import read_log
    from trainperf.cli import main

    out = tmp_path / "run"
    assert main(["run", "qwen35_397b_grpo", "--seed", "0", "--out", str(out), "--quiet",
                 "--set", "max_samples=256"]) != 0  # the budget ends before the target: aborted, as asked
    records = read_log(out / "mlperf_log.txt")
    keys = {r["key"]: r["value"] for r in records}
    assert keys["num_generations_per_prompt"] == 16 and keys["num_prompts_per_step"] == 8
    assert keys["global_batch_size"] == 128 and keys["eval_samples"] == tasks.VALIDATION
    assert keys["generation_validation_rollout_temperature"] == 0.1 and keys["opt_name"] == "adamw"
    assert [r["metadata"]["samples_count"] for r in records if r["key"] == "eval_accuracy"] == [256]
    # where a step's time went: generation and the sandbox's grading, kept with the result
    counters = json.loads((out / "result.json").read_text())["counters"]
    assert counters["rollout tokens"] > 0 and counters["reward seconds"] > 0 and counters["sandbox programs"] > 0


@pytest.mark.second_tier
def test_two_processes_reach_the_mini_target(tmp_path: Path) -> None:
    """Data parallelism over two gloo processes: each generates and grades its half of the step's prompts,
    the loss summed over both and divided by the global batch's tokens, to the mini's target."""
    from trainperf.cli import main

    out = tmp_path / "two"
    assert main(["run", "qwen35_397b_grpo", "--nproc", "2", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "success" and result["final_metric"] > MINI.target


def test_another_batch_moves_the_prompts_the_rate_and_the_clip_norm_as_the_rules_do() -> None:
    recipe, said = FULL_RECIPES["gbs256"].for_batch(1024, "sqrt")
    expected = FULL_RECIPES["gbs1024"]
    assert (recipe.num_prompts_per_step, recipe.global_batch_size) == (64, 1024)
    assert math.isclose(recipe.lr, expected.lr) and math.isclose(recipe.max_grad_norm, expected.max_grad_norm)
    assert said[0] == "global_batch_size 256 -> 1024"
    with pytest.raises(TrainperfError, match="multiple of num_generations_per_prompt"):
        FULL_RECIPES["gbs256"].for_batch(100)
