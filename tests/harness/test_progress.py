"""The live display: rich on a terminal, plain lines otherwise."""

from __future__ import annotations

import io

from rich.console import Console

from trainperf.harness.progress import PlainProgress, RichProgress


def _drive(progress) -> None:
    progress.start("resnet", 3, 4)
    for epoch in (1, 2):
        progress.epoch_start(epoch)
        for step in range(1, 5):
            progress.step(epoch, step, 100.0 * step, 0.5 if progress.wants_loss() else None)
        progress.epoch_end(epoch, 400.0, 0.5)
        progress.evaluation(f"epoch {epoch}", f"top1 {0.9 + epoch / 100:.4f}", ">= 0.97")
    progress.close()


def test_rich_progress_renders_fields_across_epochs():
    buf = io.StringIO()
    _drive(RichProgress(Console(file=buf, force_terminal=True, width=160)))
    out = buf.getvalue()
    assert "samples/s" in out and "epoch 2/3" in out and "top1 0.9200 @ epoch 2" in out


def test_plain_progress_prints_a_line_per_epoch_and_eval():
    buf = io.StringIO()
    _drive(PlainProgress(buf))
    lines = buf.getvalue().splitlines()
    assert lines[0] == "resnet: up to 3 epochs of 4 steps"
    assert lines[1].startswith("epoch 1/3") and "400.0 samples/s" in lines[1] and "loss 0.5000" in lines[1]
    assert lines[2] == "eval  epoch 1  top1 0.9100  (target >= 0.97)"
    assert len(lines) == 5
