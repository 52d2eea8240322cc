"""Every reader of user input, for the fuzzing harness (test_fuzz.py): a valid example of its input
and how to read it. Adding a reader — a new workload's data format, say — is one `Reader(...)` line
in READERS.

A reader is given the path of a (mutated) input file inside a fresh folder; it must either accept
the input or raise TrainperfError with one line; outputs it writes there must be whole or absent.
"""

from __future__ import annotations

import gzip
import io
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class Reader:
    name: str
    filename: str  # the input's name in its folder
    valid: Callable[[], bytes]  # a valid input (computed once)
    read: Callable[[Path], object]  # reads the file at this path
    # Whole outputs the reader writes beside its input (checked complete-or-absent after a failure).
    outputs: tuple[str, ...] = field(default=())
    # Share of the harness's example budget (a reader that runs a subprocess per input gets fewer).
    budget: float = 1.0
    # The workloads whose data this reader reads (none: a results file every workload writes). The
    # conformance test wants every registered workload named by at least one reader.
    workloads: tuple[str, ...] = ()
    # Damaged inputs met in real files, each (what, bytes): every one must be refused in one line.
    damaged: tuple[tuple[str, Callable[[], bytes]], ...] = ()


# -- valid examples ---------------------------------------------------------------------------------
@cache
def _jpeg() -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@cache
def _png() -> bytes:
    pixels = np.random.default_rng(1).integers(0, 256, (16, 16), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buf, format="PNG")
    return buf.getvalue()


@cache
def _ratings() -> bytes:
    from trainperf.workloads.ncf import data as D

    with tempfile.TemporaryDirectory() as tmp:
        D.generate_ratings(Path(tmp) / "ratings.csv", n_users=25, n_items=40)
        return (Path(tmp) / "ratings.csv").read_bytes()


@cache
def _criteo_day() -> bytes:
    from trainperf.workloads.dlrm import data as D
    from trainperf.workloads.dlrm import mini as G

    with tempfile.TemporaryDirectory() as tmp:
        G.generate_days(Path(tmp), 1, 40)
        return D.day_file(Path(tmp), 0).read_bytes()


@cache
def _mlperf_log() -> bytes:
    from tests.harness import fakes
    from trainperf.contract import RuntimeContext
    from trainperf.harness import RunConfig, run

    with tempfile.TemporaryDirectory() as tmp:
        workload = fakes.Regression([0.2, 0.95])
        log = Path(tmp) / "result_0.txt"
        run(RunConfig(workload=workload, recipe=workload.recipe("mini"), scale="mini", data_dir=Path(tmp), seed=1,
                      log_path=log), RuntimeContext.create("cpu"))
        return log.read_bytes()


@cache
def _published_log() -> bytes:
    """A published-style ResNet log (noise lines between records): 3 evaluations, success."""
    lines, t = ["Beginning trial 1 of 1"], 1_000_000

    def rec(key: str, value: object = None, **meta: object) -> None:
        lines.append(":::MLLOG " + json.dumps({"namespace": "", "time_ms": t, "event_type": "POINT_IN_TIME",
                                               "key": key, "value": value, "metadata": meta}))

    rec("submission_benchmark", "resnet")
    rec("global_batch_size", 3264)
    rec("run_start")
    for epoch in (3, 7, 11):
        t += 150_000
        rec("eval_start", epoch_num=epoch)
        t += 1_500
        rec("eval_stop", epoch_num=epoch)
        rec("eval_accuracy", 0.5 + epoch / 50, epoch_num=epoch)
        lines.append(f"epoch {epoch}: Speed 26000 samples/sec")
    rec("run_stop", status="success")
    return ("\n".join(lines) + "\n").encode()


def _predict_from_log(path: Path) -> object:
    from trainperf import registry
    from trainperf.science import predict

    return predict.check_log(path, registry.get("resnet"))


@cache
def _result_json() -> bytes:
    from tests.harness import fakes
    from trainperf.contract import RuntimeContext
    from trainperf.harness import RunConfig, run

    with tempfile.TemporaryDirectory() as tmp:
        workload = fakes.Regression([0.2, 0.95])
        result = run(RunConfig(workload=workload, recipe=workload.recipe("mini"), scale="mini", data_dir=Path(tmp),
                               seed=1, log_path=None), RuntimeContext.create("cpu"))
        return json.dumps(result.to_dict(), indent=1).encode()


@cache
def _system_json() -> bytes:
    import torch

    from trainperf.results import submission

    desc = submission.system_description("box", "trainperf", "open", "onprem", torch.device("cpu"), 1)
    return json.dumps(desc, indent=1).encode()


@cache
def _scaling_json() -> bytes:
    from trainperf.bench import scaling

    def run(ttt: float) -> dict:
        return {"status": "success", "time_to_train_s": ttt, "epoch_times_s": [ttt / 4] * 4, "epochs_to_target": 4,
                "recipe": {"global_batch_size": 32}}

    rows = scaling.summarize({1: [run(10.0), run(11.0)], 2: [run(6.0)]})
    return json.dumps({"title": "resnet mini", "rows": [vars(r) for r in rows]}, indent=1).encode()


@cache
def _ablation_json() -> bytes:
    rows = [{"config": "baseline (all off)", "mode": "baseline", "overrides": [], "samples_per_s": 100.0, "uplift": 1.0,
             "mfu": 0.1, "epochs_to_target": None, "time_to_train_s": None, "reached": None},
            {"config": "bf16 alone", "mode": "alone", "overrides": ["precision=bf16"], "samples_per_s": 150.0,
             "uplift": 1.5, "mfu": 0.08, "epochs_to_target": 4, "time_to_train_s": 3.0, "reached": True}]
    return json.dumps({"title": "resnet mini", "rows": rows}, indent=1).encode()


@cache
def _coco_instances() -> bytes:
    from trainperf.workloads.common.coco import data as C

    with tempfile.TemporaryDirectory() as tmp:
        C.generate_mini(Path(tmp) / "coco", C.COCO2017, (6, 1), size=32, say=lambda s: None)
        data = json.loads((Path(tmp) / "coco" / "annotations" / "instances_train2017.json").read_bytes())
    # A crowd region as COCO writes them (uncompressed RLE): its size and runs get mutated too.
    first = data["images"][0]
    data["annotations"].append({"id": 10**6, "image_id": first["id"], "category_id": data["categories"][0]["id"],
                                "bbox": [0, 0, 8, 8], "area": 64, "iscrowd": 1,
                                "segmentation": {"size": [first["height"], first["width"]],
                                                 "counts": [0, 8, first["height"] * first["width"] - 8]}})
    return json.dumps(data).encode()


# -- how each is read -------------------------------------------------------------------------------
def _decode(path: Path) -> object:
    from trainperf.workloads.resnet.images import decode

    return decode(path)


def _convert_ratings(path: Path) -> object:
    from trainperf.workloads.ncf import data as D

    return D.convert(path, path.parent, lambda s: None)


def _parse_day(path: Path) -> object:
    from trainperf.workloads.dlrm import data as D

    return [block.shape for block in D.iter_day(path)]


def _gz(valid: Callable[[], bytes]) -> Callable[[], bytes]:
    return lambda: gzip.compress(valid(), mtime=0)


def _parse_gz_day(path: Path) -> object:
    from trainperf.workloads.dlrm import data as D

    return [block.shape for block in D.iter_day(path)]


def _results_folder(path: Path, name: str) -> Path:
    """A results layout holding `path` as `name` (results/<system>/<benchmark>/...)."""
    folder = path.parent / "results" / "box" / "resnet"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(path.read_bytes())
    return path.parent / "results"


def _log_header(path: Path) -> object:
    from trainperf.results.compliance import read_header

    return read_header(path)


def _check_log(path: Path) -> object:
    from trainperf.results.compliance import check

    return check(path).verdict


def _score_log(path: Path) -> object:
    from trainperf.results import scoring

    return [scoring.score_folder(folder) for folder in
            scoring.find_benchmark_folders(_results_folder(path, "result_0.txt"))]


def _report(paths: list[Path], out: Path) -> object:
    from trainperf.report import collect, render

    return render.build(collect.collect(paths), out.stem)


def _report_log(path: Path) -> object:
    return _report([_results_folder(path, "result_0.txt")], path.parent / "report.html")


def _report_result(path: Path) -> object:
    folder = path.parent / "run"
    folder.mkdir()
    (folder / "result.json").write_bytes(path.read_bytes())
    return _report([folder], path.parent / "report.html")


def _report_system(path: Path) -> object:
    layout = path.parent / "layout"
    logs = layout / "results" / "box" / "resnet"
    logs.mkdir(parents=True)
    (logs / "result_0.txt").write_bytes(_mlperf_log())
    (layout / "systems").mkdir()
    (layout / "systems" / "box.json").write_bytes(path.read_bytes())
    return _report([layout], path.parent / "report.html")


def _report_study(path: Path) -> object:
    folder = path.parent / "study"
    folder.mkdir()
    (folder / path.name).write_bytes(path.read_bytes())
    return _report([folder], path.parent / "report.html")


def _coco_root(path: Path) -> Path:
    """The mutated instances file in a COCO layout beside it, with the images the valid file names
    (the mutated file may name others)."""
    root = path.parent / "coco"
    (root / "annotations").mkdir(parents=True)
    (root / "train2017").mkdir()
    for entry in json.loads(_coco_instances())["images"]:
        (root / "train2017" / entry["file_name"]).write_bytes(b"")
    (root / "annotations" / "instances_train2017.json").write_bytes(path.read_bytes())
    return root


def _read_coco(path: Path) -> object:
    from trainperf.workloads.common.coco import data as C

    return C.read_instances(_coco_root(path), "train2017")


def _read_coco_masks(path: Path) -> object:
    from trainperf.workloads.common.coco import data as C
    from trainperf.workloads.common.coco import masks as K

    index = C.read_instances(_coco_root(path), "train2017", masks=True)
    # What was accepted must rasterise: pycocotools sees only checked segmentations.
    return [K.rasterize(s, *hw).sum() for s, hw in zip(index.segmentations or [], index.sizes, strict=True)]


@cache
def _english() -> bytes:
    from trainperf.workloads.common.wmt import synthetic

    return "".join(en + "\n" for en, _ in synthetic.corpus(20, seed=3)).encode()


def _read_parallel(path: Path) -> object:
    from trainperf.workloads.common.wmt import synthetic
    from trainperf.workloads.common.wmt import text as T

    german = path.with_name("corpus.de")  # the valid other side: the mutated one may not match it
    german.write_text("".join(de + "\n" for _, de in synthetic.corpus(20, seed=3)), encoding="utf-8")
    return T.read_parallel(path, german)


def _vocab_bpe() -> bytes:
    return b"die\nder\nHund\nKat@@\nze\n.\n,\n"


def _read_vocab_bpe(path: Path) -> object:
    from trainperf.workloads.gnmt import data as D

    return D.read_vocabulary(path)


def _bert_rows() -> dict[str, np.ndarray]:
    from trainperf.workloads.bert import batches as B

    return B.random_rows(4, 32, 5, 50, np.random.default_rng(0))


def _bert_records(change: Callable[[dict], None] | None = None) -> bytes:
    """Pretraining examples in the reference's TFRecord form (protobuf Examples by the tfrecord package);
    `change(features)` edits each record's features before it is written (its CRCs stay valid)."""
    from tfrecord.writer import TFRecordWriter

    from trainperf.workloads.bert import batches as B
    from trainperf.workloads.bert import records as R

    rows, buf = _bert_rows(), io.BytesIO()
    for i in range(4):
        features = ({key: (np.asarray(rows[key][i]).reshape(-1).tolist(), "int") for key in B.KEYS}
                    | {"masked_lm_weights": ((rows["masked_lm_positions"][i] > 0).astype(float).tolist(), "float")})
        if change is not None:
            change(features)
        R.write_record(buf, TFRecordWriter.serialize_tf_example(features))
    return buf.getvalue()


@cache
def _bert_tfrecord() -> bytes:
    return _bert_records()


def _bert_record_of_length(length: int) -> bytes:
    """A record header whose length has a valid CRC but runs far past the end of the file."""
    import struct

    from trainperf.workloads.bert import records as R

    raw = struct.pack("<Q", length)
    return raw + struct.pack("<I", R.masked_crc(raw)) + _bert_tfrecord()


def _bert_feature_as(key: str, kind: str) -> bytes:
    cast = {"byte": lambda v: str(v).encode(), "float": float}[kind]
    return _bert_records(lambda f: f.update({key: ([cast(v) for v in f[key][0]], kind)}))


def _bert_feature_kind_as_varint() -> bytes:
    """An Example whose one feature holds a varint where a value list belongs (protobuf allows the bytes)."""
    from trainperf.workloads.bert import records as R

    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    buf = io.BytesIO()
    R.write_record(buf, field(1, field(1, field(1, b"input_ids") + field(2, bytes([3 << 3, 5])))))
    return buf.getvalue()


def _read_bert_tfrecord(path: Path) -> object:
    from trainperf.workloads.bert import data as D

    return D.tfrecord_to_rows(path)


@cache
def _bert_vocab() -> bytes:
    return b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n##s\nword\n"


def _read_bert_vocab(path: Path) -> object:
    from trainperf.workloads.bert import corpus

    return corpus.Tokenizer(path).encode(["the words"])


@cache
def _flac() -> bytes:
    import soundfile

    buf = io.BytesIO()
    tone = np.sin(np.arange(1600) * 0.3).astype(np.float32) * 0.5
    soundfile.write(buf, tone, 16_000, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def _read_flac(path: Path) -> object:
    from trainperf.workloads.rnnt import data as D

    return D.read_audio(path)


@cache
def _transcripts() -> bytes:
    return b"19-198-0000 NORTHANGER ABBEY\n19-198-0001 THIS LITTLE WORK WAS FINISHED IN THE YEAR EIGHTEEN O THREE\n"


def _read_transcripts(path: Path) -> object:
    from trainperf.workloads.rnnt import data as D

    return D.read_transcripts(path)


@cache
def _manifest() -> bytes:
    entry = {"transcript": "northanger abbey", "original_duration": 1.5,
             "files": [{"fname": "dev-clean/19/198/19-198-0000.flac", "sample_rate": 16000, "num_samples": 24000,
                        "duration": 1.5}]}
    return json.dumps([entry, entry]).encode()


def _read_manifest(path: Path) -> object:
    from trainperf.workloads.rnnt import data as D

    return D.read_manifest(path)


@cache
def _spm_model() -> bytes:
    from trainperf.workloads.rnnt import data as D

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "librispeech32.model"
        D.train_sentencepiece(["the cat sat on the mat", "a dog ran in the park", "the end"] * 20, out, 32)
        return out.read_bytes()


def _read_spm_model(path: Path) -> object:
    from trainperf.workloads.rnnt import load_tokenizer

    return load_tokenizer(path).encode("the cat")


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


@cache
def _kits_image() -> bytes:
    return _npy(np.random.default_rng(0).standard_normal((1, 6, 5, 4)).astype(np.float32))


@cache
def _kits_label() -> bytes:
    return _npy((np.arange(120).reshape(1, 6, 5, 4) % 3).astype(np.uint8))


def _read_kits_image(path: Path) -> object:
    from trainperf.workloads.unet3d import data as D

    label = path.parent / "case_00000_y.npy"
    label.write_bytes(_kits_label())
    return D.load_case("00000", path, label)


def _read_kits_label(path: Path) -> object:
    from trainperf.workloads.unet3d import data as D

    image = path.parent / "case_00000_x.npy"
    image.write_bytes(_kits_image())
    return D.load_case("00000", image, path)


@cache
def _nifti() -> bytes:
    import nibabel

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "imaging.nii.gz"
        nibabel.save(nibabel.Nifti1Image(np.arange(60, dtype=np.int16).reshape(3, 4, 5),
                                         np.diag([0.8, 0.7, 0.7, 1.0])), str(out))
        return out.read_bytes()


def _read_nifti(path: Path) -> object:
    from trainperf.workloads.unet3d import data as D

    return D.read_nifti(path, "00000")


def _float_volume(nan: bool = False, shape: tuple[int, int, int] = (3, 4, 5),
                  pixdim: tuple[float, float, float] | None = None) -> bytes:
    import nibabel

    volume = np.linspace(-200, 400, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    if nan:  # outside the field of view, as a resampled scan has it
        volume[:, 0] = np.nan
    image = nibabel.Nifti1Image(volume, np.diag([0.8, 0.7, 0.7, 1.0]))
    if pixdim is not None:  # the header's spacing alone (the reference reads pixdim, not the affine)
        image.header["pixdim"][1:4] = pixdim
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "imaging.nii"  # uncompressed: byte flips reach the voxels
        nibabel.save(image, str(out))
        return out.read_bytes()


@cache
def _float_nifti() -> bytes:
    return _float_volume(nan=False)


def _preprocess_nifti_case(path: Path) -> object:
    """A float case through the whole preprocessing (resampling, clipping, normalising), its
    segmentation written beside it."""
    import nibabel

    from trainperf.workloads.unet3d import data as D

    case = path.parent / "case_00000"
    case.mkdir()
    # Mutated uncompressed (so that byte flips reach the voxels), then compressed as KiTS19 has it.
    (case / "imaging.nii.gz").write_bytes(gzip.compress(path.read_bytes()))
    try:  # the segmentation has the image's shape: a damaged image is refused for what is wrong with it
        shape = tuple(nibabel.load(str(path)).shape)
    except Exception:  # noqa: BLE001 - a mutated header: any shape does
        shape = (3, 4, 5)
    if len(shape) != 3 or not 0 < int(np.prod(shape)) <= 10**6:
        shape = (3, 4, 5)
    nibabel.save(nibabel.Nifti1Image(np.zeros(shape, np.uint8), np.diag([0.8, 0.7, 0.7, 1.0])),
                 str(case / "segmentation.nii.gz"))
    return D.preprocess_case(case)


def _crowd_rle_of_the_wrong_size() -> bytes:
    data = json.loads(_coco_instances())
    height, width = data["annotations"][-1]["segmentation"]["size"]
    data["annotations"][-1]["segmentation"]["size"] = [height + 1, width]
    return json.dumps(data).encode()


def _crowd_rle_runs_too_long() -> bytes:
    data = json.loads(_coco_instances())
    data["annotations"][-1]["segmentation"]["counts"].append(7)
    return json.dumps(data).encode()


@cache
def _minigo_network() -> bytes:
    import torch

    from trainperf.workloads.minigo import model as M

    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.save(M.DualNet(5, width=4, blocks=1, fc_width=4).state_dict(), buf)
    return buf.getvalue()


def _read_minigo_network(path: Path) -> object:
    from trainperf.contract import Assets
    from trainperf.workloads.minigo import MINI, MiniGoWorkload

    recipe = MINI.with_overrides(["width=4", "blocks=1", "fc_width=4", f"target_model={path}"])
    workload = MiniGoWorkload()
    return workload.target_network(recipe, Assets(workload.assets(recipe, None)))


@cache
def _megatron_pair() -> tuple[bytes, bytes]:
    from trainperf.workloads.common.llm import indexed

    folder = Path(tempfile.mkdtemp())
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 60, int(n)) for n in rng.integers(1, 40, 12)]
    indexed.write(folder / "c4", docs, np.dtype(np.uint16))
    return (folder / "c4.idx").read_bytes(), (folder / "c4.bin").read_bytes()


def _read_megatron(path: Path, beside: int) -> object:
    """A `.bin`/`.idx` pair with one side mutated: read as a run reads it (every document, samples cut)."""
    from trainperf.workloads.common.llm import indexed

    other = path.with_suffix(".bin" if path.suffix == ".idx" else ".idx")
    other.write_bytes(_megatron_pair()[beside])
    data = indexed.IndexedDataset(path.with_suffix(""))
    data.check_vocabulary(64)
    docs = [data.document(i) for i in range(len(data))]
    samples = indexed.Samples(data, 8, seed=1)
    return docs, [samples.sample(i) for i in range(len(samples))]


@cache
def _govreport_parquet() -> bytes:
    from trainperf.workloads.llama2_70b_lora import data as gov
    from trainperf.workloads.llama2_70b_lora import synthetic

    folder = Path(tempfile.mkdtemp())
    ids, labels, _ = synthetic.samples(6, 5)
    gov.write_rows(folder / "rows.parquet", ids, labels)
    return (folder / "rows.parquet").read_bytes()


def _read_govreport(path: Path) -> object:
    from trainperf.workloads.llama2_70b_lora import data as gov
    from trainperf.workloads.llama2_70b_lora import synthetic

    ids, labels = gov.read_rows(path, synthetic.VOCAB, synthetic.SEQ_LEN)
    return gov.stack(ids, labels, list(range(len(ids))), synthetic.SEQ_LEN)


@cache
def _lora_base() -> bytes:
    import torch

    from trainperf.workloads.common.llm import hf
    from trainperf.workloads.common.llm.model import Llama, LlamaConfig

    folder = Path(tempfile.mkdtemp())
    config = LlamaConfig(layers=1, dim=16, heads=2, kv_heads=1, ffn_dim=32, vocab_size=24, rope_factor=0.0,
                         rope_theta=10_000.0, rope_original_context=8)
    torch.manual_seed(0)
    hf.write(Llama(config, 8), config, folder, dtype=torch.float32)
    (folder / "config.json").replace(_LORA_CONFIG)
    return (folder / "model.safetensors").read_bytes()


_LORA_CONFIG = Path(tempfile.mkdtemp()) / "config.json"


def _read_lora_base(path: Path) -> object:
    from trainperf.workloads.common.llm import hf
    from trainperf.workloads.common.llm.model import Llama

    _lora_base()
    (path.parent / "config.json").write_bytes(_LORA_CONFIG.read_bytes())
    checkpoint = hf.Checkpoint(path.parent)
    model = Llama(checkpoint.config, 8)
    checkpoint.load_into(model)
    return model


# A DeepSeek-V3 of two blocks (a dense one, an MoE one of 4 experts and a shared one), FP8 routed experts with
# block scales as deepseek-ai publishes them.
_DEEPSEEK_CONFIG = {
    "model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 16, "vocab_size": 24,
    "num_attention_heads": 2, "q_lora_rank": 8, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4,
    "v_head_dim": 4, "first_k_dense_replace": 1, "intermediate_size": 32, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 8, "n_shared_experts": 1, "n_group": 2, "topk_group": 1,
    "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-6,
    "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 8, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}, "rope_theta": 10000.0,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [8, 8]}}


@cache
def _deepseek_config() -> bytes:
    return json.dumps(_DEEPSEEK_CONFIG, indent=1).encode()


def _read_deepseek_config(path: Path) -> object:
    from trainperf.workloads.common.llm.hf_deepseek import read_deepseek_config

    return read_deepseek_config(path.parent)


@cache
def _deepseek_shard() -> bytes:
    import types

    import torch
    from safetensors.torch import save

    from trainperf.workloads.common.llm.hf_deepseek import DeepSeekCheckpoint, read_deepseek_config
    from trainperf.workloads.common.llm.moe_model import MoETransformer

    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_bytes(_deepseek_config())
    config = read_deepseek_config(folder)
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in MoETransformer(config, 8).state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for ours, theirs in DeepSeekCheckpoint.names(types.SimpleNamespace(config=config)):
        shape = shapes[ours]
        if ".experts." not in ours:
            tensors[theirs] = torch.randn(shape, generator=gen)
            continue
        for e in range(shape[0]):
            name = theirs.replace(".experts.0.", f".experts.{e}.")
            tensors[name] = torch.randn(shape[2], shape[1], generator=gen).to(torch.float8_e4m3fn)
            tensors[name + "_scale_inv"] = torch.rand(-(-shape[2] // 8), -(-shape[1] // 8), generator=gen)
    return save(tensors, metadata={"format": "pt"})


def _read_deepseek_shard(path: Path) -> object:
    from trainperf.workloads.common.llm.hf_deepseek import DeepSeekCheckpoint
    from trainperf.workloads.common.llm.moe_model import MoETransformer

    (path.parent / "config.json").write_bytes(_deepseek_config())
    checkpoint = DeepSeekCheckpoint(path.parent)
    checkpoint.check_headers()
    model = MoETransformer(checkpoint.config, 8)
    checkpoint.load_into(model)
    return model


@cache
def _multi_hot_day() -> dict[str, bytes]:
    """A day of 6 rows in the reference's multi-hot layout: its three files' bytes."""
    from trainperf.workloads.dlrm_dcnv2 import data as mh
    from trainperf.workloads.dlrm_dcnv2 import synthetic

    folder = Path(tempfile.mkdtemp())
    dense, sparse, labels, _ = synthetic.Teacher(0).sample(6, np.random.default_rng(0))
    mh.write_day(folder, 0, dense, sparse, labels)
    return {path.name: path.read_bytes() for path in mh.day_files(folder, 0)}


def _read_multi_hot(path: Path) -> object:
    from trainperf.workloads.dlrm_dcnv2 import data as mh
    from trainperf.workloads.dlrm_dcnv2 import synthetic

    for name, content in _multi_hot_day().items():  # the day's other two files, valid
        if name != path.name:
            (path.parent / name).write_bytes(content)
    rows = mh.open_split(path.parent, "train", synthetic.HOTNESS, synthetic.TABLES, 1)
    return rows.read(0, rows.total)


def _stored_member_compressed() -> bytes:
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(_multi_hot_day()["day_0_sparse_multi_hot.npz"])) as source, \
            zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            target.writestr(info.filename, source.read(info.filename))
    return buffer.getvalue()


@cache
def _yambda_store() -> dict[str, bytes]:
    """dlrmv4's trainer store of 5 users (histories of 6), in the reference's layout: its files' bytes by path."""
    from tests.workloads.test_dlrmv4 import small_events
    from trainperf.workloads.dlrmv4 import synthetic

    folder = Path(tempfile.mkdtemp())
    mapped = np.arange(40)
    synthetic.write_store(folder, small_events(1, users=5), 6, mapped // 4 + 1, mapped // 2 + 7)
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _yambda_file(name: str) -> str:
    return next(path for path in _yambda_store() if path.endswith("/" + name))


def _read_yambda(path: Path) -> object:
    """The store with this one file mutated, opened and every anchor made a sample (tables of 64 rows)."""
    from trainperf.workloads.dlrmv4 import data

    for relative, content in _yambda_store().items():
        target = path.parent / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes() if relative.endswith("/" + path.name) else content)
    store = data.Store(path.parent, 6, 12, max_seq_len=24, cross_specs=data.CROSS_SPECS[:2],
                       id_rows=(64, 64, 64, 64))
    return store.batch(np.arange(len(store.anchors)))


@cache
def _flux_arrow() -> bytes:
    """A save_to_disk shard of 3 rows in the FLUX.1 reference's preprocessed schema."""
    import torch

    from trainperf.workloads.flux1 import data as flux

    folder = Path(tempfile.mkdtemp()) / "coco_preprocessed"
    g = torch.Generator().manual_seed(0)
    flux.write_dataset(folder, {
        "__key__": ["a", "b", "c"], "timestep": [0, 1, 7],
        "t5_encodings": [flux.encode(torch.randn(4, 8, generator=g)) for _ in range(3)],
        "clip_encodings": [flux.encode(torch.randn(6, generator=g)) for _ in range(3)],
        "mean": [flux.encode(torch.randn(4, 2, 2, generator=g)) for _ in range(3)],
        "logvar": [flux.encode(torch.zeros(4, 2, 2)) for _ in range(3)]})
    return (folder / "data-00000-of-00001.arrow").read_bytes()


def _read_flux_arrow(path: Path) -> object:
    """A (mutated) arrow shard named by its folder's state.json: every cell decoded as a run reads it."""
    from trainperf.workloads.flux1 import data as flux

    (path.parent / "state.json").write_text(json.dumps({"_data_files": [{"filename": path.name}]}))
    rows = flux.ArrowRows(path.parent)
    return [(rows.tensor(i, "t5_encodings", (4, 8)), rows.tensor(i, "clip_encodings", (6,)),
             rows.tensor(i, "mean", (4, 2, 2)), rows.tensor(i, "logvar", (4, 2, 2)), rows.timestep(i))
            for i in range(len(rows))]


def _flux_offsets_past_their_buffer() -> bytes:
    """The arrow shard with one binary offset patched past its data (pyarrow read outside its mapping: SIGBUS)."""
    import struct

    raw = bytearray(_flux_arrow())
    for at in range(0, len(raw) - 12, 4):  # the first offsets buffer: 0, then rising int32 values
        first, second, third = struct.unpack_from("<3i", raw, at)
        if first == 0 and 0 < second < third < len(raw):
            raw[at + 4:at + 8] = struct.pack("<i", 2**30)
            return bytes(raw)
    raise AssertionError("no offsets buffer found")


def _flux_state() -> bytes:
    return json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": None}).encode()


def _read_flux_state(path: Path) -> object:
    """A (mutated) state.json beside a valid shard: its rows counted and read as a run reads them."""
    from trainperf.workloads.flux1 import data as flux

    (path.parent / "data-00000-of-00001.arrow").write_bytes(_flux_arrow())
    rows = flux.ArrowRows(path.parent)
    return [rows.tensor(i, "mean", (4, 2, 2)) for i in range(len(rows))]


def _flux_empty_npy() -> bytes:
    return _npy(np.zeros((1, 4, 8), np.float16))


def _npy_claiming(shape: tuple[int, ...], dtype: type = np.float16) -> bytes:
    """A .npy whose header claims `shape` (2 TiB, say) in front of a few bytes."""
    buffer = io.BytesIO()
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, dtype))
    header["shape"] = shape
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + b"\0" * 16


def _read_flux_empty(path: Path) -> object:
    from trainperf.workloads.flux1 import data as flux

    return flux.read_npy(path, (4, 8))


def _generated_record() -> bytes:
    return json.dumps({"generator": "trainperf", "workload": "ncf", "files": {"ratings.csv": 8},
                       "dirs": []}).encode()


def _read_generated_record(path: Path) -> object:
    """A (mutated) record of generated files in a mini folder: read as `prepare` reads it to decide what it may
    replace. Nothing outside the folder may be named, nothing ever deleted by reading it."""
    from trainperf import jobs, registry

    (path.parent / "ratings.csv").write_bytes(b"1,2,3,4\n")
    try:
        return jobs.check_generation_target(registry.get("ncf"), path.parent)
    finally:
        assert (path.parent / "ratings.csv").read_bytes() == b"1,2,3,4\n"


def _suite_json() -> bytes:
    return json.dumps({"scale": "mini", "runs": 1, "seed": 3, "workloads": ["ncf"], "system": None, "data": None,
                       "device": None, "wall_s": 1.0, "rows": []}).encode()


def _read_suite_json(path: Path) -> object:
    from trainperf import suite

    return suite.resumable(path.parent, ["ncf"], "mini", 1, None)


def _megatron_float_tokens() -> bytes:
    """An index whose token dtype code says float32 (Megatron's table allows it): NaN/inf ids must be one line."""
    import struct

    from trainperf.workloads.common.llm import indexed

    raw = bytearray(_megatron_pair()[0])
    struct.pack_into("<B", raw, len(indexed.MAGIC) + 8, 7)
    return bytes(raw)


def _r2e_rows() -> bytes:
    from trainperf.workloads.common.rl import r2e

    code = "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        pass\n"
    tests = {"r2e_tests/test_1.py": code}
    rows = [r2e.build_row(f"acme__calc-{i:040d}", "acme/calc", f"issue {i}", tests, {"T.test_a": "PASSED"},
                          "swe_agents_val", container_id=i) for i in range(2)]
    return b"".join(json.dumps(row, separators=(",", ":")).encode() + b"\n" for row in rows)


def _read_r2e(path: Path) -> object:
    from trainperf.workloads.common.rl import r2e

    return list(r2e.read_tasks(path))


READERS: list[Reader] = [
    Reader("R2E-Gym task rows (jsonl)", "benchmark_r2e_gym_easy_val.jsonl", _r2e_rows, _read_r2e,
           workloads=("qwen35_397b_grpo",)),
    Reader("imagenet jpeg", "n0_0.JPEG", _jpeg, _decode, workloads=("resnet",)),
    Reader("imagenet png named JPEG", "n0_1.JPEG", _png, _decode, workloads=("resnet",)),
    Reader("movielens ratings.csv", "ratings.csv", _ratings, _convert_ratings,
           outputs=("train-ratings.csv", "test-ratings.csv", "test-negative.csv", "trainperf_ncf.json"),
           workloads=("ncf",)),
    Reader("criteo day", "day_0", _criteo_day, _parse_day, workloads=("dlrm",)),
    Reader("coco instances json", "instances_train2017.json", _coco_instances, _read_coco,
           workloads=("ssd", "retinanet")),
    Reader("coco instances json with masks", "instances_train2017.json", _coco_instances, _read_coco_masks,
           workloads=("maskrcnn",), damaged=(("crowd RLE of the wrong size", _crowd_rle_of_the_wrong_size),
                                             ("crowd RLE runs past the image", _crowd_rle_runs_too_long))),
    Reader("wmt parallel text", "corpus.en", _english, _read_parallel, workloads=("transformer", "gnmt")),
    Reader("gnmt vocab.bpe", "vocab.bpe.32000", _vocab_bpe, _read_vocab_bpe, workloads=("gnmt",)),
    Reader("bert tfrecord", "part-00000-of-00500", _bert_tfrecord, _read_bert_tfrecord, workloads=("bert",),
           damaged=(("a record length of 2**40 with a valid CRC", lambda: _bert_record_of_length(2**40)),
                    ("a record length of 2**64 - 1 with a valid CRC", lambda: _bert_record_of_length(2**64 - 1)),
                    ("input_ids as a bytes_list", lambda: _bert_feature_as("input_ids", "byte")),
                    ("input_ids as a float_list", lambda: _bert_feature_as("input_ids", "float")),
                    ("masked_lm_weights as a bytes_list", lambda: _bert_feature_as("masked_lm_weights", "byte")),
                    ("masked_lm_weights shorter than masked_lm_positions",
                     lambda: _bert_records(lambda f: f.update(masked_lm_weights=([1.0], "float")))),
                    ("a feature's value list as a varint", _bert_feature_kind_as_varint))),
    Reader("bert vocab.txt", "vocab.txt", _bert_vocab, _read_bert_vocab, workloads=("bert",)),
    Reader("librispeech flac", "19-198-0000.flac", _flac, _read_flac, workloads=("rnnt",)),
    Reader("librispeech trans.txt", "19-198.trans.txt", _transcripts, _read_transcripts, workloads=("rnnt",)),
    Reader("rnnt manifest", "librispeech-dev-clean.json", _manifest, _read_manifest, workloads=("rnnt",)),
    Reader("sentencepiece model", "librispeech1023.model", _spm_model, _read_spm_model, workloads=("rnnt",)),
    Reader("kits19 case image .npy", "case_00000_x.npy", _kits_image, _read_kits_image, workloads=("unet3d",),
           damaged=(("a header claiming 2 TiB", lambda: _npy_claiming((1, 1 << 14, 1 << 14, 1 << 12), np.float32)),)),
    Reader("kits19 case label .npy", "case_00000_y.npy", _kits_label, _read_kits_label, workloads=("unet3d",)),
    Reader("kits19 nifti", "imaging.nii.gz", _nifti, _read_nifti, workloads=("unet3d",)),
    Reader("kits19 float nifti case, preprocessed", "imaging.nii", _float_nifti, _preprocess_nifti_case,
           workloads=("unet3d",), budget=0.5,
           damaged=(("NaN voxels", lambda: _float_volume(nan=True)),
                    ("a 1x1x1 volume", lambda: _float_volume(shape=(1, 1, 1))),
                    ("NaN spacing in the header", lambda: _float_volume(pixdim=(float("nan"), 0.7, 0.7))),
                    ("spacing that resamples to terabytes", lambda: _float_volume(pixdim=(1e12, 1e12, 1e12))))),
    Reader("megatron indexed dataset .idx", "c4.idx", lambda: _megatron_pair()[0],
           lambda p: _read_megatron(p, 1), workloads=("llama31_8b", "llama31_405b", "gpt_oss_20b", "deepseekv3_671b"),
           damaged=(("truncated index", lambda: _megatron_pair()[0][:-5]),
                    ("an empty index", lambda: b""),
                    ("float32 token ids", _megatron_float_tokens))),
    Reader("megatron indexed dataset .bin", "c4.bin", lambda: _megatron_pair()[1],
           lambda p: _read_megatron(p, 0), workloads=("llama31_8b", "llama31_405b", "gpt_oss_20b", "deepseekv3_671b"),
           damaged=(("truncated tokens", lambda: _megatron_pair()[1][:-3]),)),
    Reader("govreport parquet rows", "train-00000-of-00001.parquet", _govreport_parquet, _read_govreport,
           workloads=("llama2_70b_lora",), budget=0.5),
    Reader("hugging face safetensors checkpoint", "model.safetensors", _lora_base, _read_lora_base,
           workloads=("llama2_70b_lora",), budget=0.5),
    Reader("deepseek-v3 hugging face config.json", "config.json", _deepseek_config, _read_deepseek_config,
           workloads=("deepseekv3_671b",)),
    Reader("deepseek-v3 safetensors checkpoint, fp8 experts", "model.safetensors", _deepseek_shard,
           _read_deepseek_shard, workloads=("deepseekv3_671b",), budget=0.5),
    Reader("minigo target network", "target.pt", _minigo_network, _read_minigo_network, workloads=("minigo",)),
    Reader("flux.1 preprocessed arrow shard", "data-00000-of-00001.arrow", _flux_arrow, _read_flux_arrow,
           workloads=("flux1",), damaged=(("truncated shard", lambda: _flux_arrow()[:-40]),
                                          ("an empty shard", lambda: b""),
                                          ("a binary offset past its buffer", _flux_offsets_past_their_buffer))),
    Reader("flux.1 save_to_disk state.json", "state.json", _flux_state, _read_flux_state, workloads=("flux1",),
           damaged=(("a file named twice", lambda: json.dumps({"_data_files": [
               {"filename": "data-00000-of-00001.arrow"}] * 2}).encode()),)),
    Reader("flux.1 empty-prompt encoding .npy", "t5_empty.npy", _flux_empty_npy, _read_flux_empty, workloads=("flux1",),
           damaged=(("a header claiming 2 TiB", lambda: _npy_claiming((1 << 20, 1 << 20))),)),
    Reader("trainperf record of generated files", ".trainperf-generated.json", _generated_record,
           _read_generated_record,
           damaged=(("a file outside the folder", lambda: json.dumps({"generator": "trainperf", "workload": "ncf",
                                                                      "files": {"../x": 1}}).encode()),)),
    Reader("suite.json (suite --resume)", "suite.json", _suite_json, _read_suite_json),
    Reader("criteo day.gz", "day_0.gz", _gz(_criteo_day), _parse_gz_day, workloads=("dlrm",)),
    Reader("multi-hot criteo sparse .npz", "day_0_sparse_multi_hot.npz",
           lambda: _multi_hot_day()["day_0_sparse_multi_hot.npz"], _read_multi_hot, workloads=("dlrm_dcnv2",),
           damaged=(("compressed members (np.savez_compressed)", _stored_member_compressed),
                    ("cut short", lambda: _multi_hot_day()["day_0_sparse_multi_hot.npz"][:-40]))),
    Reader("multi-hot criteo dense .npy", "day_0_dense.npy", lambda: _multi_hot_day()["day_0_dense.npy"],
           _read_multi_hot, workloads=("dlrm_dcnv2",)),
    Reader("multi-hot criteo labels .npy", "day_0_labels.npy", lambda: _multi_hot_day()["day_0_labels.npy"],
           _read_multi_hot, workloads=("dlrm_dcnv2",)),
    *(Reader(f"dlrmv4 store {name}", name, (lambda name=name: _yambda_store()[_yambda_file(name)]), _read_yambda,
             workloads=("dlrmv4",))
      for name in ("flat_item_ids.npy", "positions_L6.npy", "anchor_ts_L6.npy", "user_start.npy", "store_meta.json",
                   "artist_item_mapping.parquet")),
    Reader("mlperf log header", "result_0.txt", _mlperf_log, _log_header),
    Reader("mlperf log (check)", "result_0.txt", _mlperf_log, _check_log, budget=0.1),  # the official checker
    Reader("mlperf log (score)", "result_0.txt", _mlperf_log, _score_log),
    Reader("mlperf log (report)", "result_0.txt", _mlperf_log, _report_log),
    Reader("published log (predict --from-log)", "result_0.txt", _published_log, _predict_from_log),
    Reader("result.json (report)", "result.json", _result_json, _report_result),
    Reader("systems json (report)", "box.json", _system_json, _report_system),
    Reader("scaling.json (report)", "scaling.json", _scaling_json, _report_study),
    Reader("ablation.json (report)", "ablation.json", _ablation_json, _report_study),
]
