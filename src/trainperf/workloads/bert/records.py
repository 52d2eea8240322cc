"""The reference's TFRecord files, read without TensorFlow.

A TFRecord file is a run of records: length (uint64 LE), masked CRC-32C of the length, payload,
masked CRC-32C of the payload. Both CRCs are verified (CRC-32C by google-crc32c, the maintained
implementation). The payload is a `tf.train.Example` protobuf: a map from feature name to a list of
int64, float or bytes values; its wire format is decoded here (packed int64 lists vectorised), so
neither TensorFlow nor a protobuf schema is needed."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import google_crc32c
import numpy as np

from trainperf.errors import TrainperfError

_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def read_records(path: Path) -> Iterator[bytes]:
    """The payloads of a TFRecord file, each checked against its CRCs; a damaged file is one line
    naming the file and the record."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        index = 0
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                raise TrainperfError(f"{path}: record {index}: truncated header")
            (length,) = struct.unpack("<Q", header[:8])
            (crc,) = struct.unpack("<I", header[8:])
            if masked_crc(header[:8]) != crc:
                raise TrainperfError(f"{path}: record {index}: bad length CRC (not a TFRecord file, or damaged)")
            left = size - f.tell() - 4  # what the file holds for the payload, before its 4-byte CRC
            if length > left:  # before reading: a valid CRC does not make 2**64 - 1 bytes readable
                raise TrainperfError(f"{path}: record {index}: truncated (length {length:,} bytes, "
                                     f"{max(left, 0):,} left in the file)")
            payload = f.read(length)
            footer = f.read(4)
            if len(payload) < length or len(footer) < 4:
                raise TrainperfError(f"{path}: record {index}: truncated ({len(payload)} of {length} bytes)")
            if masked_crc(payload) != struct.unpack("<I", footer)[0]:
                raise TrainperfError(f"{path}: record {index}: bad data CRC (the record is damaged)")
            yield payload
            index += 1


def write_record(f: object, payload: bytes) -> None:
    """Append one record (length, masked CRCs) to a binary file object."""
    length = struct.pack("<Q", len(payload))
    f.write(length + struct.pack("<I", masked_crc(length)) + payload  # type: ignore[attr-defined]
            + struct.pack("<I", masked_crc(payload)))


# ---------------------------------------------------------------------------------------------
# protobuf wire format
# ---------------------------------------------------------------------------------------------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 64 bits")


def _fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of a message: varints as ints, length-delimited as bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("truncated field")
            yield number, wire, buf[pos: pos + size]
            pos += size
        elif wire == 5:
            yield number, wire, buf[pos: pos + 4]
            pos += 4
        elif wire == 1:
            yield number, wire, buf[pos: pos + 8]
            pos += 8
        else:
            raise ValueError(f"unsupported wire type {wire}")


def decode_varints(buf: bytes) -> np.ndarray:
    """A packed run of varints as int64 (two's complement, as protobuf encodes negative int64)."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    if raw[-1] >= 0x80:
        raise ValueError("truncated varint")
    ends = np.flatnonzero(raw < 0x80)
    starts = np.concatenate([[0], ends[:-1] + 1])
    shift = (np.arange(raw.size) - np.repeat(starts, ends - starts + 1)).astype(np.uint64) * np.uint64(7)
    if shift.max(initial=0) > 63:
        raise ValueError("varint longer than 64 bits")
    parts = (raw & 0x7F).astype(np.uint64) << shift
    return np.add.reduceat(parts, starts).view(np.int64)


def _feature(buf: bytes) -> np.ndarray | list[bytes]:
    for number, wire, value in _fields(buf):
        if not isinstance(value, bytes):
            raise ValueError(f"feature field {number} is a varint, expected a value list")
        if number == 1:  # BytesList
            return [v for n, _w, v in _fields(value) if n == 1]  # type: ignore[misc]
        if number == 2:  # FloatList: packed fixed32, or one fixed32 per field
            chunks = [v for n, _w, v in _fields(value) if n == 1]
            return np.frombuffer(b"".join(chunks), dtype="<f4").astype(np.float32)  # type: ignore[arg-type]
        if number == 3:  # Int64List: packed varints, or one varint per field
            out = []
            for n, w, v in _fields(value):
                if n == 1:
                    out.append(decode_varints(v) if w == 2 else np.array([v], dtype=np.uint64).view(np.int64))
            return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
        del wire
    return np.zeros(0, dtype=np.int64)


def parse_example(payload: bytes) -> dict[str, np.ndarray | list[bytes]]:
    """A serialized tf.train.Example as {feature name: values}."""
    features: dict[str, np.ndarray | list[bytes]] = {}
    for number, _wire, value in _fields(payload):
        if number != 1 or not isinstance(value, bytes):
            continue
        for entry_number, _w, entry in _fields(value):
            if entry_number != 1 or not isinstance(entry, bytes):
                continue
            name, feature = b"", b""
            for n, _w2, v in _fields(entry):
                if n == 1 and isinstance(v, bytes):
                    name = v
                elif n == 2 and isinstance(v, bytes):
                    feature = v
            features[name.decode("utf-8")] = _feature(feature)
    return features


def read_examples(path: Path) -> Iterator[dict[str, np.ndarray | list[bytes]]]:
    for index, payload in enumerate(read_records(path)):
        try:
            yield parse_example(payload)
        except (ValueError, UnicodeDecodeError) as exc:
            raise TrainperfError(f"{path}: record {index}: not a tf.train.Example ({exc})") from None
