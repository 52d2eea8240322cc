"""The mini phase-1 checkpoint: made once by `trainperf make-phase1`, shipped in the package.

As in MLPerf, where phase 1 trains at 128 tokens and the timed phase 2 continues at 512 from the
phase-1 checkpoint, the mini's phase 1 trains the small BERT from scratch at 64 tokens (10
predictions) for a fixed number of steps from a fixed seed, and the timed mini run continues at 128.
The command learns the WordPiece vocabulary from the training documents, generates both datasets,
trains, and writes vocab.txt, phase1.pt and phase1.json (SHA-256 of both files, which every mini run
verifies, and the checkpoint's own accuracy on the phase-2 evaluation set)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainperf.contract import Assets, EpochView, RuntimeContext
from trainperf.files import AtomicOutput, write_text_atomic
from trainperf.workloads.bert import corpus
from trainperf.workloads.bert import data as bert_data

VOCAB_SIZE = 4096
PHASE1 = corpus.InstanceConfig(max_seq_length=64, max_predictions=10, dupe_factor=5)
SEED = 1
PHASE1_LR = 1e-2  # LAMB; probes: 4e-3 and AdamW 2e-3 learned no faster over 800 steps


def make_phase1(out: Path, steps: int, say: Callable[[str], None], seed: int = SEED,
                work: Path | None = None) -> dict[str, Any]:
    from trainperf.workloads.bert import MINI, BertWorkload

    owned = work is None
    work = Path(tempfile.mkdtemp(prefix="trainperf-phase1-")) if work is None else work
    try:
        train, _held = bert_data.split_documents()
        vocab = work / "vocab.txt"
        corpus.train_vocabulary(train, VOCAB_SIZE, vocab)
        words = len(corpus.read_vocabulary(vocab))
        say(f"vocabulary: {words} WordPiece tokens")
        bert_data.prepare_mini(work / "phase2", say, vocab=vocab)  # writes the text shards too
        phase1 = work / "phase1"
        shutil.copytree(work / "phase2" / bert_data.TEXT, phase1 / bert_data.TEXT)
        bert_data.text_to_shards(phase1, vocab, PHASE1, say, eval_sequences=bert_data.MINI_EVAL_SEQUENCES)

        workload = BertWorkload()
        recipe = dataclasses.replace(MINI, checkpoint="none", model=dataclasses.replace(MINI.model, vocab_size=words),
                                     base_lr=PHASE1_LR, train_steps=steps,
                                     warmup_steps=max(1, steps // 10), max_seq_length=PHASE1.max_seq_length,
                                     max_predictions=PHASE1.max_predictions, cache_shards=True)
        ctx = RuntimeContext.create("cpu", seed=seed)
        parts = workload.build(recipe, ctx, Assets({}))
        params = [p for group in parts.optimizer.param_groups for p in group["params"]]
        schedule = torch.optim.lr_scheduler.LambdaLR(parts.optimizer, parts.lr_schedule(None))

        def step(batch: Any) -> torch.Tensor:
            # Phase 1 is not a timed run: a plain fp32 step (the harness's step, without its options).
            parts.optimizer.zero_grad(set_to_none=True)
            loss = parts.loss_fn(parts.model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, recipe.max_grad_norm)
            parts.optimizer.step()
            schedule.step()
            return loss.detach()

        parts.model.train()
        data = workload.load_data(recipe, phase1, ctx)
        done, epoch, t0 = 0, 0, time.perf_counter()
        loss_sum = torch.zeros(())
        while done < steps:
            epoch += 1
            view = EpochView(epoch=epoch, model=parts.model, log=lambda *a, **k: None)
            for batch in data.train_batches(view):
                loss_sum += step(batch)
                done += 1
                if done % 200 == 0:
                    say(f"step {done}/{steps}: loss {float(loss_sum) / 200:.3f} ({time.perf_counter() - t0:.0f} s)")
                    loss_sum.zero_()
                if done == steps:
                    break
        accuracy = evaluate(workload, recipe, parts, work / "phase2", ctx)
        out.mkdir(parents=True, exist_ok=True)
        with AtomicOutput(out / "phase1.pt") as tmp:
            torch.save({k: v.detach().clone() for k, v in parts.model.state_dict().items()}, tmp)
        with AtomicOutput(out / "vocab.txt") as tmp:
            shutil.copyfile(vocab, tmp)
        manifest = {"checkpoint_sha256": bert_data.sha256(out / "phase1.pt"),
                    "vocab_sha256": bert_data.sha256(out / "vocab.txt"),
                    "vocab_size": words, "steps": steps, "seed": seed, "global_batch_size": recipe.global_batch_size,
                    "base_lr": recipe.base_lr, "phase1_data": dataclasses.asdict(PHASE1),
                    "mlm_accuracy_phase2_eval": round(accuracy, 5),
                    "command": f"trainperf make-phase1 --steps {steps} --seed {seed}"}
        write_text_atomic(out / "phase1.json", json.dumps(manifest, indent=1) + "\n")
        say(f"phase-1 checkpoint: {out / 'phase1.pt'}; MLM accuracy on the mini evaluation set {accuracy:.4f}")
        return manifest
    finally:
        if owned:
            shutil.rmtree(work, ignore_errors=True)


def evaluate(workload: Any, recipe: Any, parts: Any, data_dir: Path, ctx: RuntimeContext) -> float:
    """MLM accuracy of a model on a prepared dataset's evaluation set (phase-2 shape)."""
    from trainperf.workloads.bert import _accuracy

    phase2 = dataclasses.replace(recipe, max_seq_length=bert_data.MINI.max_seq_length)
    data = workload.load_data(phase2, data_dir, ctx)
    parts.model.eval()

    def forward(batch: Any) -> torch.Tensor:
        with torch.no_grad():
            return parts.eval_forward(parts.model, batch)

    partial = data.evaluate(forward)
    return float(_accuracy(partial.sums))
