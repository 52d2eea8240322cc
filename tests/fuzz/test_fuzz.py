"""Fuzzing every reader of user input (tests/fuzz/readers.py) with hypothesis: valid inputs mutated
by truncation, byte flips, inserted and removed separators, CRLF line ends, a byte-order mark, empty
files, huge fields, non-UTF-8 and NUL bytes. Each must be accepted, or refused with one line
(TrainperfError) — never another exception, never a half-written output.

The budget is fixed: FUZZ_EXAMPLES generated cases per reader (TRAINPERF_FUZZ_EXAMPLES overrides it),
derandomized so that CI runs the same cases every time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.readers import READERS, Reader
from trainperf.errors import TrainperfError

FUZZ_EXAMPLES = int(os.environ.get("TRAINPERF_FUZZ_EXAMPLES", "100"))
SEPARATORS = [b",", b"\t", b"\n", b"\r\n", b":", b"{", b"}", b'"', b" "]


def _truncate(data: bytes, at: float) -> bytes:
    return data[:int(len(data) * at)]


def _flip(data: bytes, at: float, value: int) -> bytes:
    if not data:
        return data
    i = min(int(len(data) * at), len(data) - 1)
    return data[:i] + bytes([value]) + data[i + 1:]


def _insert(data: bytes, at: float, piece: bytes) -> bytes:
    i = int(len(data) * at)
    return data[:i] + piece + data[i:]


def _remove_separator(data: bytes, at: float, sep: bytes) -> bytes:
    positions = [i for i in range(len(data)) if data.startswith(sep, i)]
    if not positions:
        return data
    i = positions[min(int(len(positions) * at), len(positions) - 1)]
    return data[:i] + data[i + len(sep):]


fraction = st.floats(0, 1, allow_nan=False)
MUTATIONS = st.one_of(
    st.tuples(st.just("truncate"), fraction),
    st.tuples(st.just("flip"), fraction, st.integers(0, 255)),
    st.tuples(st.just("insert"), fraction, st.sampled_from(SEPARATORS)),
    st.tuples(st.just("remove"), fraction, st.sampled_from(SEPARATORS)),
    st.tuples(st.just("crlf")),
    st.tuples(st.just("bom")),
    st.tuples(st.just("empty")),
    st.tuples(st.just("huge"), fraction),
    st.tuples(st.just("insert"), fraction, st.sampled_from([b"\xff\xfe\x80", b"\x00", b"\xc3(", b"\xe2\x80\x8b"])),
)


def mutate(data: bytes, mutations: list[tuple]) -> bytes:
    for kind, *args in mutations:
        if kind == "truncate":
            data = _truncate(data, *args)
        elif kind == "flip":
            data = _flip(data, *args)
        elif kind == "insert":
            data = _insert(data, *args)
        elif kind == "remove":
            data = _remove_separator(data, *args)
        elif kind == "crlf":
            data = data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
        elif kind == "bom":
            data = b"\xef\xbb\xbf" + data
        elif kind == "empty":
            data = b""
        elif kind == "huge":
            data = _insert(data, args[0], b"9" * 200_000)
    return data


def _whole_or_absent(folder: Path, reader: Reader) -> None:
    leftovers = [p.name for p in folder.rglob("*") if p.name.endswith((".partial", ".tmp"))]
    assert not leftovers, f"half-written outputs left: {leftovers}"


@pytest.mark.slow
@pytest.mark.parametrize("reader", READERS, ids=[r.name for r in READERS])
def test_reader_accepts_or_refuses_in_one_line(reader: Reader):
    valid = reader.valid()
    folder = Path(tempfile.mkdtemp(prefix="trainperf-fuzz-"))
    try:
        path = folder / reader.filename
        path.write_bytes(valid)
        reader.read(path)  # the unmutated input is accepted
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    @settings(max_examples=max(1, round(FUZZ_EXAMPLES * reader.budget)), deadline=None, derandomize=True,
              database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(MUTATIONS, min_size=1, max_size=3))
    def property(mutations: list[tuple]) -> None:
        folder = Path(tempfile.mkdtemp(prefix="trainperf-fuzz-"))
        try:
            path = folder / reader.filename
            path.write_bytes(mutate(valid, mutations))
            try:
                reader.read(path)
            except TrainperfError as exc:
                message = str(exc)
                assert message and "\n" not in message and "Traceback" not in message, message
                for name in reader.outputs:  # a refused input leaves no output of its own
                    assert not (folder / name).exists(), name
            _whole_or_absent(folder, reader)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    property()


DAMAGED = [(reader, what, make) for reader in READERS for what, make in reader.damaged]


@pytest.mark.parametrize("reader, what, make", DAMAGED, ids=[f"{r.name}: {w}" for r, w, _ in DAMAGED])
def test_damaged_inputs_met_in_real_files_are_refused_in_one_line(reader: Reader, what: str, make):
    folder = Path(tempfile.mkdtemp(prefix="trainperf-fuzz-"))
    try:
        path = folder / reader.filename
        path.write_bytes(make())
        with pytest.raises(TrainperfError) as err:
            reader.read(path)
        assert "\n" not in str(err.value), str(err.value)
        _whole_or_absent(folder, reader)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _recipe_fields() -> list[tuple[str, object]]:
    from trainperf import registry

    return [(name, registry.get(name).recipe(scale)) for name in registry.names()
            for scale in registry.get(name).scales]


@pytest.mark.parametrize("workload, recipe", _recipe_fields(), ids=lambda v: v if isinstance(v, str) else v.name)
def test_set_values_are_accepted_or_refused_in_one_line(workload, recipe):
    """`--set key=value` with any text and any number, for every field of every workload's recipes
    (nested model fields by their path and by their own name)."""
    from trainperf.contract.recipe import _settable

    paths = list(_settable(type(recipe)))
    keys = paths + [p.rsplit(".", 1)[-1] for p in paths if "." in p] + ["nope", "", "max-epochs", "model.nope"]
    values = st.one_of(st.text(max_size=40), st.sampled_from(["1", "0", "-1", "1e309", "nan", "inf", "1,2", ",", "true",
                                                               "0x10", "1_000", " 3 ", "1,,2", "\x00", "\n"]),
                       st.integers(min_value=-10**30, max_value=10**30).map(str),
                       st.floats(allow_nan=True, allow_infinity=True).map(repr))

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None)
    @given(st.sampled_from(keys), values, st.booleans())
    def property(key: str, value: str, with_sign: bool) -> None:
        item = f"{key}={value}" if with_sign else key + value
        try:
            recipe.with_overrides([item])
        except TrainperfError as exc:
            assert str(exc) and "\n" not in str(exc), str(exc)

    property()
