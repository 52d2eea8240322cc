"""The policy's files: a Hugging Face folder (config.json, safetensors, tokenizer.json) read by the family's
Qwen3.5 reader, and the mini's, made by `trainperf make-grpo-base`.

The mini's base is trained by supervised next-token prediction on the mini's training tasks, the programs
written by `tasks.teacher` (a kind's bug at its rate), so that it writes the bug where the teacher mostly did:
the mini's GRPO run starts from it, as the reference starts from Qwen3.5-397B-A17B's release."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainperf.errors import TrainperfError
from trainperf.files import sha256, verify_manifest, write_json_atomic
from trainperf.workloads.qwen35_397b_grpo import tasks

PACKAGE = Path(__file__).parent / "mini" / "policy"
POLICY_FILES = ("config.json", "model.safetensors", "tokenizer.json")
PAD = "<pad>"
BASE_STEPS = 1500
BASE_SEED = 0


def char_tokenizer(alphabet: str) -> Any:
    """A character-level `tokenizers` tokenizer: id 0 is padding, then one id per character of `alphabet`."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {PAD: 0, **{c: i + 1 for i, c in enumerate(alphabet)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(PAD, special=True)])
    return tokenizer


class Text:
    """A policy folder's tokenizer.json as the loop uses it: prompts to ids, completions back to text."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        path = folder / "tokenizer.json"
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception types for unreadable files
            raise TrainperfError(f"{path}: not a tokenizers tokenizer.json ({str(exc)[:120]})") from None
        self.pad = self.tokenizer.token_to_id(PAD) or 0
        self.stop = self.tokenizer.token_to_id("\n")
        if self.stop is None:
            raise TrainperfError(f"{path}: no newline token (the mini's completions end with one)")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def prompt(statement: str) -> str:
    """What the mini's policy is shown: the task's statement and a colon; it answers with f's expression and
    a newline."""
    return statement + ":"


def verify_shipped(folder: Path) -> None:
    """The shipped base is the one its manifest names (the mini's target was calibrated from it)."""
    verify_manifest(folder, POLICY_FILES, "the shipped GRPO base")


def make_base(out: Path, steps: int, say: Callable[[str], None], seed: int) -> dict[str, Any]:
    """`trainperf make-grpo-base`: the mini's policy, trained on the teacher's programs for the training
    tasks (batch 64, AdamW 3e-3 with 50 warmup steps and a cosine), written as a Hugging Face folder with its
    tokenizer and a manifest."""
    import torch
    import torch.nn.functional as F

    from trainperf.workloads.common.llm import hf_qwen35
    from trainperf.workloads.common.llm.qwen35 import Qwen35
    from trainperf.workloads.qwen35_397b_grpo.recipes import MINI

    torch.manual_seed(seed)
    model = Qwen35(MINI.model, MINI.max_sequence_length)
    model.reset_parameters()
    tokenizer = char_tokenizer(tasks.ALPHABET)
    train, _ = tasks.split_specs(tasks.VALIDATION, tasks.SPLIT_SEED)
    pairs = tasks.teacher(train, random.Random(seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for step in range(steps):
        rows, starts = [], []
        for _ in range(64):
            statement, program = next(pairs)
            head = tokenizer.encode(prompt(statement)).ids
            rows.append(head + tokenizer.encode(program + "\n").ids)
            starts.append(len(head))
        width = max(map(len, rows))
        tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        targets = tokens[:, 1:].clone()
        for i, start in enumerate(starts):
            targets[i, :start - 1] = -100  # the statement is given, not learnt
        targets[targets == 0] = -100
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100)
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 250 == 0 or step == steps - 1:
            say(f"step {step}: loss {loss.item():.4f}")
    hf_qwen35.write(model, out, dtype=torch.float32)
    tokenizer.save(str(out / "tokenizer.json"))
    manifest = {"steps": steps, "seed": seed, "batch": 64,
                "teacher_bug_rate": dict(zip([k[0] for k in tasks.KINDS], tasks.TEACHER_BUG_RATE, strict=True)),
                "sha256": {name: sha256(out / name) for name in POLICY_FILES},
                "command": f"trainperf make-grpo-base --steps {steps} --seed {seed}"}
    write_json_atomic(out / "base.json", manifest)
    say(f"wrote {out}")
    return manifest
