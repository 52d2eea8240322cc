"""Reading the next batches from a memory map while the device trains."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any


def prefetched(batches: Iterator[Any], depth: int = 4) -> Iterator[Any]:
    """Read the next batches from the memory map in a thread while the device trains."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()

    def fill() -> None:
        try:
            for item in batches:
                q.put(item)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            q.put(exc)
        q.put(done)

    threading.Thread(target=fill, daemon=True, name="trainperf-dlrm-reader").start()
    while (item := q.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield item
