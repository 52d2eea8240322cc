"""Helpers for workloads whose data comes through torch DataLoader workers (ImageNet, COCO, LibriSpeech,
KiTS19): one-line errors from worker processes, and a device prefetcher."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch

from trainperf import devices
from trainperf.errors import TrainperfError

T = TypeVar("T")

_WORKER_MARK = "Original Traceback (most recent call last):"
_PREFIX = f"{TrainperfError.__module__}.{TrainperfError.__qualname__}: "


def worker_message(message: str) -> str:
    """The original message of an error a DataLoader worker raised. The DataLoader re-raises it in
    the main process with the worker's whole traceback in the message; the user needs one line."""
    if _WORKER_MARK not in message:
        return message
    tail = message.split(_WORKER_MARK, 1)[1]
    found = [line for line in tail.splitlines() if line.startswith(_PREFIX)]
    if found:
        return found[-1][len(_PREFIX):]
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else message.splitlines()[0]


def one_line_errors(batches: Iterable[T]) -> Iterator[T]:
    """Iterate `batches`; a TrainperfError from a worker (an undecodable file, say) comes out as the
    one line the worker raised, naming the file, instead of a multi-line traceback."""
    try:
        yield from batches
    except TrainperfError as exc:
        raise TrainperfError(worker_message(str(exc))) from None


class DevicePrefetcher:
    """Copies the next batch to the device on a side stream while the current one trains; errors from
    the loader's workers come out as one line."""

    def __init__(self, loader: Any, device: torch.device) -> None:
        self.loader = loader
        self.device = device

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        if self.device.type != "cuda":
            yield from one_line_errors(self.loader)
            return
        stream = devices.side_stream(self.device)
        pending = None
        for batch in one_line_errors(self.loader):
            nxt = tuple(devices.copy_async(t, self.device, stream) for t in batch)
            if pending is not None:
                yield pending
            devices.hand_over(nxt, self.device, stream)
            pending = nxt
        if pending is not None:
            yield pending
