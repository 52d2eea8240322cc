"""The decoders' sample order against Megatron-Core itself (`megatron-core`, a test-only peer): the samples
trainperf cuts from a Megatron indexed corpus for a seed are, one by one and in order, those of megatron-core's
`GPTDataset` built with the same seed, sequence length and requested sample count (one pass, several passes
shuffled together, a final pass shuffled on its own), and a blend's share and order are its builder's."""

from __future__ import annotations

import logging
import types
import warnings

import numpy as np
import pytest

from trainperf.workloads.common.llm import indexed

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # megatron-core warns that Transformer Engine and Apex are absent
    core = pytest.importorskip("megatron.core.datasets.gpt_dataset")
    from megatron.core.datasets import helpers
    from megatron.core.datasets.blended_megatron_dataset_builder import _get_size_per_split_per_dataset
    from megatron.core.datasets.indexed_dataset import IndexedDataset as TheirIndexed
    from megatron.core.datasets.utils import Split


def _theirs(prefix, seq_len: int, seed: int, num_samples: int | None) -> object:
    logging.getLogger("megatron").setLevel(logging.ERROR)
    tokenizer = types.SimpleNamespace(vocab_size=1_000, eod=0, pad=0, unique_identifiers={"class": "none"})
    config = core.GPTDatasetConfig(random_seed=seed, sequence_length=seq_len, blend=None, split="1,0,0",
                                   tokenizer=tokenizer, reset_position_ids=False, reset_attention_mask=False,
                                   eod_mask_loss=False, path_to_cache=None, mmap_bin_files=True)
    data = TheirIndexed(str(prefix), multimodal=False, mmap=True)
    return core.GPTDataset(data, str(prefix), np.arange(len(data), dtype=np.int32), num_samples, Split.train, config)


# (documents, sequence length, seed, samples asked for, the shortest document): one pass; one pass, fewer
# asked; 4 passes (the last nearly whole); 3 passes, the last under 80 % (shuffled on its own); many passes of
# long sequences; empty documents among them.
CASES = [(50, 16, 1234, None, 1), (50, 16, 7, 10, 1), (40, 8, 3, 200, 1), (40, 8, 3, 150, 1), (30, 32, 99, 500, 1),
         (60, 8, 5, 300, 0)]


@pytest.mark.parametrize(("documents", "seq_len", "seed", "asked", "shortest"), CASES)
def test_the_samples_are_megatron_gpt_dataset_s_for_the_same_seed(tmp_path, documents, seq_len, seed, asked,
                                                                  shortest):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(1, 999, size=int(rng.integers(shortest, 3 * seq_len))) for _ in range(documents)]
    indexed.write(tmp_path / "c", docs, np.dtype(np.uint16))
    theirs = _theirs(tmp_path / "c", seq_len, seed, asked)
    ours = indexed.Samples(indexed.IndexedDataset(tmp_path / "c"), seq_len, seed, asked)
    assert len(ours) == len(theirs)
    for k in range(len(theirs)):
        expected = theirs._query_document_sample_shuffle_indices(k)[0]
        assert np.array_equal(ours.sample(k), expected), k


def test_a_large_index_is_built_once_and_read_from_the_cache(tmp_path, monkeypatch):
    """Past CACHED_ENTRIES the indices are written to trainperf's cache by the first process and memory-mapped
    by every later one (Megatron keeps them beside the data), their sample starts found a chunk of documents at
    a time: the same samples either way, and megatron-core's."""
    monkeypatch.setenv("TRAINPERF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(indexed, "CACHED_ENTRIES", 10)
    monkeypatch.setattr(indexed, "INDEX_CHUNK", 7)  # the samples' starts found a few documents at a time
    rng = np.random.default_rng(0)
    indexed.write(tmp_path / "c", [rng.integers(1, 999, size=int(rng.integers(1, 40))) for _ in range(30)],
                  np.dtype(np.uint16))
    data = indexed.IndexedDataset(tmp_path / "c")
    built = indexed.Samples(data, 8, 11, 300)
    (folder,) = (tmp_path / "cache" / "megatron-indices").iterdir()
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".npy") == [
        "document_index.npy", "sample_index.npy", "shuffle_index.npy"]
    read = indexed.Samples(data, 8, 11, 300)
    assert isinstance(read.order, np.memmap)
    assert all(np.array_equal(built.sample(k), read.sample(k)) for k in range(len(built)))
    theirs = _theirs(tmp_path / "c", 8, 11, 300)
    assert all(np.array_equal(read.sample(k), theirs._query_document_sample_shuffle_indices(k)[0])
               for k in range(0, len(read), 7))


@pytest.mark.parametrize("parts", [2, 3])
def test_a_blend_shares_and_alternates_as_megatron_s_builder(parts):
    """The samples asked of each equally weighted corpus (the builder's 0.5 % surplus), and the blend's order
    (`build_blending_indices`): sample k is sample k // n of corpus k % n."""
    for size in (10, 1_382_400_000, 38_400_001):
        weights = [1.0 / parts] * parts
        assert indexed.blended_share(size, parts) == _get_size_per_split_per_dataset(weights, [size], 0.005)[0][0]
    dataset_index = np.zeros(60, dtype=np.int16)
    sample_index = np.zeros(60, dtype=np.int64)
    helpers.build_blending_indices(dataset_index, sample_index, np.array([1.0 / parts] * parts), parts, 60, False)
    k = np.arange(60)
    assert (dataset_index == k % parts).all() and (sample_index == k // parts).all()


def test_the_data_sets_sizes_follow_the_recipe_as_each_reference_derives_them():
    """The samples each reference asks Megatron-Core for, from the recipe's own fields (a --set batch keeps
    them the reference's): the 8B's NeMo validation size (102,401,024 at GBS 32), the 405B's (30,862,080 at
    1,152, in file order), DeepSeek-V3's Megatron-Bridge sizes (100 and 101 batches), GPT-OSS's 1,024."""
    from trainperf import registry

    eight = registry.get("llama31_8b").recipe("full")
    assert eight.with_overrides(["global_batch_size=32"]).eval_dataset_size == 102_401_024
    assert registry.get("llama31_8b").full.recipes["gbs32"].train_dataset_size == 38_400_000
    big = registry.get("llama31_405b").full.recipes["gbs1152"]
    assert (big.eval_dataset_size, big.eval_shuffle, big.train_dataset_size) == (30_862_080, False, 1_382_400_000)
    deepseek = registry.get("deepseekv3_671b").full.recipes["gbs16384"]
    assert (deepseek.train_dataset_size, deepseek.eval_dataset_size) == (100 * 16_384, 101 * 16_384)
    assert registry.get("gpt_oss_20b").full.recipes["gbs16"].eval_dataset_size == 1_024
