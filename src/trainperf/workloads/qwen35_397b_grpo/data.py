"""Where the tasks come from: the reference's two R2E-Gym files (`download_dataset.sh` of mlcommons/training
`llm_post_training`: the training file, or its newer curriculum-ordered name, and the validation file), or the
mini's generated tasks written in the same layout."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from trainperf.contract import DataSource
from trainperf.errors import TrainperfError
from trainperf.files import write_json_atomic
from trainperf.workloads.common.rl import r2e
from trainperf.workloads.qwen35_397b_grpo import tasks


def train_file(data_dir: Path) -> Path:
    """The training tasks: the curriculum file where the folder has it (the reference's current
    download), else the plain one."""
    curriculum = data_dir / tasks.CURRICULUM_FILE
    return curriculum if curriculum.is_file() else data_dir / tasks.TRAIN_FILE


def count_rows(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())


class R2EGymFiles(DataSource):
    """The reference's files, read as they are (the rows are validated when a run reads them)."""

    def problems(self, data_dir: Path) -> list[str]:
        found = []
        if not train_file(data_dir).is_file():
            found.append(f"{data_dir / tasks.TRAIN_FILE}: missing (or {tasks.CURRICULUM_FILE}; the reference's "
                         "download_dataset.sh writes them)")
        if not (data_dir / tasks.VAL_FILE).is_file():
            found.append(f"{data_dir / tasks.VAL_FILE}: missing")
        return found

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        problems = self.problems(data_dir)
        if problems:
            raise TrainperfError(problems[0])
        for path in (train_file(data_dir), data_dir / tasks.VAL_FILE):
            rows = sum(1 for _ in r2e.read_tasks(path))
            say(f"{path}: {rows:,} tasks")

    def sources(self, data_dir: Path) -> dict[str, Path]:
        return {"training tasks": train_file(data_dir), "validation tasks": data_dir / tasks.VAL_FILE}

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        path = data_dir / tasks.VAL_FILE
        return path, count_rows(path)


class GeneratedTasks(R2EGymFiles):
    """The mini's tasks (tasks.py) in the reference's two files, and a marker written last."""

    generated = True

    def problems(self, data_dir: Path) -> list[str]:
        found = super().problems(data_dir)
        if not found and not (data_dir / tasks.MARKER).is_file():
            found.append(f"{data_dir / tasks.MARKER}: missing (the mini's tasks were not written here)")
        return found

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        present = [p for p in (data_dir / tasks.TRAIN_FILE, data_dir / tasks.CURRICULUM_FILE,
                               data_dir / tasks.VAL_FILE) if p.exists()]
        if present and not (data_dir / tasks.MARKER).is_file():
            raise TrainperfError(f"{present[0]}: task files the mini did not write are there; the mini writes its "
                                 "own tasks only into a folder without them (--data another folder)")
        say(f"writing the qwen35_397b_grpo mini's tasks in {data_dir}")
        train, val = tasks.write(data_dir, tasks.VALIDATION, tasks.SPLIT_SEED)
        write_json_atomic(data_dir / tasks.MARKER, {"train": train, "validation": val,
                                                    "kinds": [k[0] for k in tasks.KINDS]})
        say(f"{train} training tasks, {val} validation tasks")

    def sources(self, data_dir: Path) -> dict[str, Path]:
        return {}


def read(path: Path, limit: int = 0) -> list[r2e.Task]:
    """A task file's rows (the first `limit`, 0: all); an empty file is one line."""
    out = []
    for task in r2e.read_tasks(path):
        out.append(task)
        if limit and len(out) == limit:
            break
    if not out:
        raise TrainperfError(f"{path}: no tasks")
    return out


def summary(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))
