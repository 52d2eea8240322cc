"""FLUX.1's data as the reference's preprocessing leaves it (torchtitan `mlperf-training-flux.1`,
`scripts/preprocess_flux_dataset.py`, `save_empty_encodings.py`; mlcommons/training `text_to_image/README.md`):

- `cc12m_preprocessed/` (training, 1,099,776 rows) and `coco_preprocessed/` (validation, 29,696 rows): Hugging
  Face datasets written by `save_to_disk` (`state.json` naming the `data-XXXXX-of-YYYYY.arrow` files, Arrow IPC
  streams), columns `__key__` (string), `t5_encodings`, `clip_encodings`, `mean`, `logvar` (binary: the bytes
  of `np.save` of a bf16 tensor viewed as uint16: T5's last hidden state [256, 4096], CLIP's pooled output
  [768], the autoencoder posterior's mean and log-variance [16, 32, 32]) and, in the validation set,
  `timestep` (int32: 0-7, each sample's fixed timestep k / 8; the training loader never reads it);
- `empty_encodings/t5_empty.npy` [1, 256, 4096] and `clip_empty.npy` [1, 768] (float16): the empty prompt's
  encodings, which replace a sample's with probability `cfg_prob` in training.

Each step samples the latent from the stored posterior, z = mean + exp(logvar / 2) ε, and normalises it as the
autoencoder does, (z - 0.1159) x 0.3611. Rows are read in file order (the reference does not shuffle either),
each global batch the next `global_batch_size` rows, wrapping around at the end; the processes split each batch
(the reference gives each process a contiguous block of the file instead, so its global batches depend on the
number of processes).

The reader needs pyarrow only (not the `datasets` package): every file is checked when opened, and anything
wrong is one line naming the file, the row and what was expected.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.arrays import load_npy
from trainperf.contract import DataParts, DataSource, EpochView, EvalPartial, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.workloads.common.llm.data import lockstep_rows
from trainperf.workloads.flux1.recipes import EVAL_SAMPLES, TRAIN_SAMPLES, FluxRecipe

SCALE_FACTOR = 0.3611  # FLUX.1's autoencoder: latents are (z - shift) x scale
SHIFT_FACTOR = 0.1159
TRAIN_DIR = "cc12m_preprocessed"
VALID_DIR = "coco_preprocessed"
EMPTY_DIR = "empty_encodings"
EMPTY_FILES = ("t5_empty.npy", "clip_empty.npy")
BINARY = ("t5_encodings", "clip_encodings", "mean", "logvar")
COLUMNS = ("__key__", *BINARY, "timestep")
TIMESTEPS = 8  # the validation set's fixed timesteps: k / 8 for k in 0..7
EVAL_SEED = 20_251_216  # the evaluation's noise: drawn per validation row from this seed, the same every run


# ---------------------------------------------------------------------------------------------
# cells: np.save bytes of bf16 bits
# ---------------------------------------------------------------------------------------------
def encode(tensor: torch.Tensor) -> bytes:
    """A tensor as the reference stores a cell: np.save of its bf16 bits as uint16."""
    buffer = io.BytesIO()
    np.save(buffer, tensor.to(torch.bfloat16).view(torch.uint16).numpy(), allow_pickle=False)
    return buffer.getvalue()


def decode(cell: bytes | None, where: str) -> torch.Tensor:
    """A stored cell back as a bf16 tensor; anything else is one line naming `where`."""
    if not cell:
        raise TrainperfError(f"{where}: empty, expected the np.save bytes of a bf16 tensor")
    array = load_npy(cell, where)  # its header checked against the bytes there before anything is allocated
    if array.dtype != np.uint16:
        raise TrainperfError(f"{where}: .npy of {array.dtype}, expected uint16 (the bits of bf16 values)")
    return torch.from_numpy(np.ascontiguousarray(array)).view(torch.bfloat16)


def read_npy(path: Path, shape: tuple[int, ...]) -> torch.Tensor:
    """An empty-prompt encoding file (float16 .npy, a leading batch dimension of 1) as an fp32 tensor of
    `shape`."""
    if not path.is_file():
        raise TrainperfError(f"{path}: missing")
    array = load_npy(path)
    if array.dtype.kind != "f":
        raise TrainperfError(f"{path}: {array.dtype} values, expected floats (float16 as the reference saves them)")
    if array.shape not in (shape, (1, *shape)):
        raise TrainperfError(f"{path}: shape {list(array.shape)}, expected [1, {', '.join(map(str, shape))}]")
    values = torch.from_numpy(array.astype(np.float32)).reshape(shape)
    if not torch.isfinite(values).all():
        raise TrainperfError(f"{path}: non-finite values")
    return values


# ---------------------------------------------------------------------------------------------
# a save_to_disk folder
# ---------------------------------------------------------------------------------------------
def _features() -> dict[str, Any]:
    kinds = {"__key__": "string", "timestep": "int32", **{name: "binary" for name in BINARY}}
    return {name: {"dtype": kinds[name], "_type": "Value"} for name in COLUMNS}


def write_dataset(folder: Path, rows: dict[str, list[Any]], shard_rows: int = 10_000, batch_rows: int = 1_000
                  ) -> None:
    """Columns as a Hugging Face `save_to_disk` folder of Arrow stream files of record batches of `batch_rows`
    (what `load_from_disk` and this module read; `timestep` may be left out), written beside and renamed into
    place."""
    import pyarrow as pa

    count = len(rows["__key__"])
    columns = [c for c in COLUMNS if c in rows]
    types = {"__key__": pa.string(), "timestep": pa.int32(), **{name: pa.binary() for name in BINARY}}
    features = {c: f for c, f in _features().items() if c in rows}
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    schema = pa.schema([pa.field(name, types[name]) for name in columns], metadata=meta)
    shards = max(1, math.ceil(count / shard_rows))
    partial = folder.with_name(folder.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    names = []
    for s in range(shards):
        name = f"data-{s:05d}-of-{shards:05d}.arrow"
        part = slice(s * shard_rows, min(count, (s + 1) * shard_rows))
        table = pa.table({c: pa.array(rows[c][part], type=types[c]) for c in columns}, schema=schema)
        with pa.OSFile(str(partial / name), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            writer.write_table(table, max_chunksize=batch_rows)
        names.append(name)
    (partial / "dataset_info.json").write_text(json.dumps({"citation": "", "description": "", "features": features,
                                                           "homepage": "", "license": ""}, indent=2))
    (partial / "state.json").write_text(json.dumps({
        "_data_files": [{"filename": n} for n in names], "_fingerprint": f"{count:016x}", "_format_columns": None,
        "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False, "_split": None}, indent=2))
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    partial.rename(folder)


class ArrowRows:
    """A `save_to_disk` folder's rows, memory-mapped: its files from state.json, each an Arrow stream of record
    batches with the reference's columns, read where they lie (a row is found by its batch: nothing is copied
    but the cells asked for). `timestep` is required of the validation set only (`timestep()`)."""

    def __init__(self, folder: Path) -> None:
        import pyarrow as pa

        self.folder = folder
        state = folder / "state.json"
        try:
            files = [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
        except FileNotFoundError:
            raise TrainperfError(f"{state}: missing (a folder written by the reference's save_to_disk)") from None
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise TrainperfError(f"{state}: expected JSON with a `_data_files` list of {{\"filename\": ...}}") from None
        if not files or not all(isinstance(f, str) and f and "/" not in f and f not in (".", "..") for f in files):
            raise TrainperfError(f"{state}: `_data_files` names no arrow file of this folder")
        twice = next((f for i, f in enumerate(files) if f in files[:i]), None)
        if twice is not None:  # its rows would be read twice: a training set duplicated, an evaluation set padded
            raise TrainperfError(f"{state}: `_data_files` names {twice} twice; save_to_disk names each file once")
        self.batches: list[tuple[Path, int, Any]] = []  # (file, its first row in the file, record batch)
        self.starts = [0]
        self.files = 0
        for name in files:
            path = folder / name
            try:
                reader = pa.ipc.open_stream(pa.memory_map(str(path)))
                batches = list(reader)
            except FileNotFoundError:
                raise TrainperfError(f"{path}: missing (named by {state})") from None
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise TrainperfError(f"{path}: not an Arrow stream ({str(exc).splitlines()[0][:120]})") from None
            self._check_schema(path, reader.schema)
            for k, batch in enumerate(batches):
                # Offsets past their buffers (a damaged file) make pyarrow read outside the mapping and the
                # process die (SIGBUS/SIGSEGV, no log closed): every offset is checked before any cell is read,
                # in O(rows) (the cells themselves are not read).
                try:
                    batch.validate(full=True)
                except (pa.ArrowException, ValueError) as exc:
                    raise TrainperfError(f"{path}: record batch {k} is damaged ({str(exc).splitlines()[0][:160]})"
                                         ) from None
            self.files += 1
            first = 0
            for batch in batches:
                if batch.num_rows:
                    self.batches.append((path, first, batch))
                    self.starts.append(self.starts[-1] + batch.num_rows)
                    first += batch.num_rows

    @staticmethod
    def _check_schema(path: Path, schema: Any) -> None:
        import pyarrow as pa

        missing = [c for c in ("__key__", *BINARY) if c not in schema.names]
        if missing:
            raise TrainperfError(f"{path}: no column {', '.join(missing)} (expected {', '.join(COLUMNS)})")
        for c in BINARY:
            kind = schema.field(c).type
            if not pa.types.is_binary(kind) and not pa.types.is_large_binary(kind):
                raise TrainperfError(f"{path}: column {c} is {kind}, expected binary")
        if "timestep" in schema.names and not pa.types.is_integer(schema.field("timestep").type) \
                and not pa.types.is_null(schema.field("timestep").type):
            raise TrainperfError(f"{path}: column timestep is {schema.field('timestep').type}, expected int32")

    def __len__(self) -> int:
        return self.starts[-1]

    def _locate(self, i: int) -> tuple[Path, Any, int, int]:
        import bisect

        k = bisect.bisect_right(self.starts, i) - 1
        path, first, batch = self.batches[k]
        return path, batch, i - self.starts[k], first + i - self.starts[k]

    def cell(self, i: int, column: str) -> Any:
        _, batch, j, _ = self._locate(i)
        return batch.column(column)[j].as_py()

    def tensor(self, i: int, column: str, shape: tuple[int, ...]) -> torch.Tensor:
        path, batch, j, row = self._locate(i)
        where = f"{path}: row {row} column {column}"
        value = decode(batch.column(column)[j].as_py(), where)
        if tuple(value.shape) not in (shape, (1, *shape)):
            raise TrainperfError(f"{where}: shape {list(value.shape)}, expected {list(shape)}")
        return value.reshape(shape)

    def timestep(self, i: int) -> int:
        path, batch, j, row = self._locate(i)
        k = batch.column("timestep")[j].as_py() if "timestep" in batch.schema.names else None
        if k is None or not 0 <= k < TIMESTEPS:
            raise TrainperfError(f"{path}: row {row} column timestep: {k}, expected 0 to {TIMESTEPS - 1} (the "
                                 "validation set's fixed timesteps)")
        return int(k)


# ---------------------------------------------------------------------------------------------
# samples
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shapes:
    text_tokens: int
    text_dim: int
    pooled_dim: int
    latent_channels: int
    latent_size: int

    @classmethod
    def of(cls, recipe: FluxRecipe) -> Shapes:
        m = recipe.model
        return cls(recipe.text_tokens, m.context_in_dim, m.vec_in_dim, m.latent_channels, recipe.latent_size)

    @property
    def t5(self) -> tuple[int, int]:
        return self.text_tokens, self.text_dim

    @property
    def latent(self) -> tuple[int, int, int]:
        return self.latent_channels, self.latent_size, self.latent_size


class _Rows(torch.utils.data.Dataset):
    """Decoded rows (bf16 tensors) by index: a training row, or with `eval_noise` a validation row with its
    timestep and its fixed noise (the posterior's and the diffusion's, drawn from the row's own seed: the same
    whatever the processes or the batch)."""

    def __init__(self, folder: Path, shapes: Shapes, eval_noise: bool = False) -> None:
        self.folder, self.shapes, self.eval_noise = folder, shapes, eval_noise
        self.rows: ArrowRows | None = None

    def __len__(self) -> int:
        return len(self._open())

    def _open(self) -> ArrowRows:
        if self.rows is None:  # in each worker: memory maps are not shared across fork safely
            self.rows = ArrowRows(self.folder)
        return self.rows

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        rows, s = self._open(), self.shapes
        sample = {"t5": rows.tensor(i, "t5_encodings", s.t5), "clip": rows.tensor(i, "clip_encodings",
                                                                                    (s.pooled_dim,)),
                  "mean": rows.tensor(i, "mean", s.latent), "logvar": rows.tensor(i, "logvar", s.latent)}
        if self.eval_noise:
            gen = torch.Generator().manual_seed(EVAL_SEED + i)
            sample["posterior_noise"] = torch.randn(s.latent, generator=gen)
            sample["noise"] = torch.randn(s.latent, generator=gen)
            sample["t"] = torch.tensor(rows.timestep(i) / TIMESTEPS)
        return sample


def latents(mean: torch.Tensor, logvar: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """A latent drawn from the autoencoder's posterior and normalised as FLUX.1's autoencoder does (fp32)."""
    mean, logvar = mean.float(), logvar.float()
    if noise is None:
        noise = torch.randn_like(mean)
    return (mean + torch.exp(0.5 * logvar) * noise - SHIFT_FACTOR) * SCALE_FACTOR


def pack(latent: torch.Tensor, patch: int = 2) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/p)(W/p), C p p]: each p x p patch one token, its channels outermost."""
    b, c, h, w = latent.shape
    x = latent.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpack(tokens: torch.Tensor, channels: int, size: int, patch: int = 2) -> torch.Tensor:
    b = tokens.shape[0]
    g = size // patch
    x = tokens.reshape(b, g, g, channels, patch, patch)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, channels, size, size)


class FluxPipeline:
    def __init__(self, recipe: FluxRecipe, data_dir: Path, ctx: RuntimeContext) -> None:
        self.recipe, self.ctx = recipe, ctx
        self.shapes = Shapes.of(recipe)
        self.train = _Rows(data_dir / TRAIN_DIR, self.shapes)
        self.valid = _Rows(data_dir / VALID_DIR, self.shapes, eval_noise=True)
        self.rows = len(self.train)
        valid_rows = len(self.valid)
        # Every sample's shape checked once now, where a mistake is cheap to report.
        self.train[0], self.valid[0]  # noqa: B018
        if valid_rows < recipe.eval_samples:
            raise TrainperfError(f"{data_dir / VALID_DIR}: {valid_rows:,} rows, the evaluation needs "
                                 f"{recipe.eval_samples:,}")
        if self.rows < recipe.global_batch_size:
            raise TrainperfError(f"{data_dir / TRAIN_DIR}: {self.rows:,} rows, fewer than one global batch of "
                                 f"{recipe.global_batch_size:,}")
        self.steps_per_epoch = math.ceil(self.rows / recipe.global_batch_size)
        empty = data_dir / EMPTY_DIR
        # bf16 as the rows' encodings (the reference casts them so): replacing a prompt then casts nothing.
        self.empty_t5 = read_npy(empty / EMPTY_FILES[0], self.shapes.t5).to(ctx.device, torch.bfloat16)
        self.empty_clip = read_npy(empty / EMPTY_FILES[1], (self.shapes.pooled_dim,)).to(ctx.device, torch.bfloat16)

    def train_batches(self, view: EpochView) -> Iterator[dict[str, torch.Tensor]]:
        recipe, ctx = self.recipe, self.ctx
        gbs = recipe.global_batch_size
        per_rank = ctx.batch_share(gbs)
        # One endless pass in file order: epoch e's step s takes the rows after all earlier steps' (mod N).
        first = view.epoch * self.steps_per_epoch * gbs
        batches = [[(first + step * gbs + ctx.data_rank * per_rank + j) % self.rows for j in range(per_rank)]
                   for step in range(self.steps_per_epoch)]
        cuda = ctx.device.type == "cuda"
        loader = torch.utils.data.DataLoader(self.train, batch_sampler=batches, num_workers=recipe.num_workers,
                                             pin_memory=cuda, persistent_workers=False)
        for batch in loader:
            batch = {k: v.to(ctx.device, non_blocking=cuda) for k, v in batch.items()}
            yield self.drop_prompts(batch)

    def drop_prompts(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Classifier-free guidance training: each sample's T5 and CLIP encodings both replaced by the empty
        prompt's with probability cfg_prob (drawn on the device: no host read)."""
        p = self.recipe.cfg_prob
        if p <= 0:
            return batch
        drop = torch.rand(batch["clip"].shape[0], device=batch["clip"].device) < p
        batch["t5"] = torch.where(drop[:, None, None], self.empty_t5.to(batch["t5"].dtype), batch["t5"])
        batch["clip"] = torch.where(drop[:, None], self.empty_clip.to(batch["clip"].dtype), batch["clip"])
        return batch

    def evaluate(self, forward: Callable[[Any], Any]) -> EvalPartial:
        recipe, ctx = self.recipe, self.ctx
        loss = torch.zeros((), dtype=torch.float64, device=ctx.device)
        count = torch.zeros((), dtype=torch.float64, device=ctx.device)
        plan = list(lockstep_rows(ctx, recipe.eval_samples, recipe.eval_batch_size))
        cuda = ctx.device.type == "cuda"
        loader = torch.utils.data.DataLoader(self.valid, batch_sampler=[list(rows) for rows, _ in plan],
                                             num_workers=recipe.num_workers, pin_memory=cuda)
        for (_, counted), batch in zip(plan, loader, strict=True):
            losses = forward({k: v.to(ctx.device, non_blocking=cuda) for k, v in batch.items()})
            if counted:  # a repeated batch (processes kept in lockstep) is run, not counted
                loss += losses.double().sum()
                count += losses.numel()
        return EvalPartial(metric=validation_loss, sums={"loss": loss, "samples": count})


def validation_loss(totals: dict[str, Any]) -> float:
    """The mean over the validation samples of each one's mean squared error (at its fixed timestep)."""
    return float(totals["loss"]) / max(1.0, float(totals["samples"]))


def data_parts(recipe: FluxRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
    pipeline = FluxPipeline(recipe, data_dir, ctx)
    return DataParts(train_batches=pipeline.train_batches, steps_per_epoch=pipeline.steps_per_epoch,
                     train_samples=pipeline.rows, eval_samples=recipe.eval_samples, evaluate=pipeline.evaluate)


class PreprocessedFlux(DataSource):
    """The reference's preprocessed CC12M and COCO and its empty-prompt encodings: checked, never made here
    (its preprocessing runs the T5-XXL, CLIP and autoencoder over 1.1 M images: about 2.5 TB)."""

    def __init__(self, train_rows: int = TRAIN_SAMPLES, valid_rows: int = EVAL_SAMPLES) -> None:
        self.train_rows, self.valid_rows = train_rows, valid_rows

    # Who writes each missing file, said beside it (None: nobody to name: a generated dataset).
    writers: dict[str, str] | None = {"state.json": "preprocess_flux_dataset.py", "npy": "save_empty_encodings.py"}

    def problems(self, data_dir: Path) -> list[str]:
        def missing(path: Path, writer: str) -> str:
            return f"{path}: missing" + (f" (the reference's {self.writers[writer]} writes it)" if self.writers else "")

        found = [missing(data_dir / d / "state.json", "state.json") for d in (TRAIN_DIR, VALID_DIR)
                 if not (data_dir / d / "state.json").is_file()]
        found += [missing(data_dir / EMPTY_DIR / f, "npy") for f in EMPTY_FILES
                  if not (data_dir / EMPTY_DIR / f).is_file()]
        return found

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        problems = self.problems(data_dir)
        if problems:
            raise TrainperfError("; ".join(problems))
        for d in (TRAIN_DIR, VALID_DIR):
            rows = ArrowRows(data_dir / d)
            say(f"{data_dir / d}: {len(rows):,} rows in {rows.files} arrow files")

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        return data_dir / VALID_DIR / "state.json", len(ArrowRows(data_dir / VALID_DIR))

    def verify(self, data_dir: Path, workers: int, progress: Callable[[int, int, int], None]) -> list[str] | None:
        problems = self.problems(data_dir)
        if problems:
            return problems
        bad: list[str] = []
        try:
            for d in (TRAIN_DIR, VALID_DIR):
                rows = ArrowRows(data_dir / d)
                total = len(rows)
                for i in range(total):
                    try:
                        for column in BINARY:
                            value = decode(rows.cell(i, column), f"{data_dir / d}: row {i} column {column}")
                            if not torch.isfinite(value.float()).all():
                                raise TrainperfError(f"{data_dir / d}: row {i} column {column}: non-finite values")
                        if d == VALID_DIR:
                            rows.timestep(i)
                    except TrainperfError as exc:
                        bad.append(str(exc))
                    if i % 4096 == 0 or i == total - 1:
                        progress(i + 1, total, len(bad))
        except TrainperfError as exc:
            return [str(exc)]
        return bad
