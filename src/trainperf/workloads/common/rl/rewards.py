"""Verifiable rewards: each completion turned into a task's files, its tests run in the sandbox pool,
graded by R2E-Gym's rule (reward 1.0 when the test summary matches the task's expected statuses).

A completion's reward depends only on its task and its text (the tests are deterministic programs), so a
text already graded for a task is not run again: at the reference's validation temperature (0.1) most of
a task's k samples are the same text. The reference runs every trajectory; the rewards are the same.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from trainperf.workloads.common.rl import r2e, sandbox
from trainperf.workloads.common.rl.engine import Rollouts

RUNNER = (Path(__file__).parent / "task_runner.py").read_text()


class SandboxRewarder:
    """Rewards for completions of `tasks[owner[i]]`: `decode` turns a completion's tokens into text,
    `files_of(task, text)` into the files its tests import (the task's tests and the runner are added),
    each job run in `pool` under `limits`."""

    def __init__(self, pool: sandbox.Pool, tasks: Sequence[r2e.Task], decode: Callable[[list[int]], str],
                 files_of: Callable[[r2e.Task, str], Mapping[str, str]],
                 limits: sandbox.Limits = sandbox.Limits(wall_s=5.0, cpu_s=5), memo: int = 100_000) -> None:
        self.pool, self.tasks, self.decode, self.files_of, self.limits = pool, tasks, decode, files_of, limits
        self.memo: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.capacity = memo
        self.runs = 0

    def grade(self, pairs: Sequence[tuple[int, str]]) -> list[float]:
        """Rewards of (task index, completion text) pairs."""
        keys = [(self.tasks[t].instance_id, text) for t, text in pairs]
        known = {key: self.memo[key] for key in keys if key in self.memo}
        todo = {}
        for (t, text), key in zip(pairs, keys, strict=True):
            if key not in known and key not in todo:
                task = self.tasks[t]
                files = {**task.test_files, **self.files_of(task, text), "task_runner.py": RUNNER}
                todo[key] = (task, sandbox.Job(files, "task_runner.py", ("r2e_tests",), self.limits))
        if todo:
            outcomes = self.pool.run([job for _, job in todo.values()])
            self.runs += len(outcomes)
            for (key, (task, _)), outcome in zip(todo.items(), outcomes, strict=True):
                # the summary decides, not the exit code (R2E-Gym's rule); a run killed or timed out gets 0
                known[key] = 1.0 if outcome.status in ("passed", "failed") and r2e.resolved(
                    outcome.stdout, task.expected) else 0.0
                self.memo[key] = known[key]
                if len(self.memo) > self.capacity:
                    self.memo.popitem(last=False)
        return [known[key] for key in keys]

    def __call__(self, owner: Sequence[int], rollouts: Rollouts) -> torch.Tensor:
        texts = [self.decode(rollouts.tokens[i, :int(rollouts.lengths[i])].tolist()) for i in range(len(owner))]
        return torch.tensor(self.grade(list(zip(owner, texts, strict=True))))
