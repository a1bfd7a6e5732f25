"""Python's full garbage collections, held back while a search runs.

A search fills the cost model's memos with millions of long-lived, acyclic objects (placements,
tuples, arrays) and makes almost no reference cycles. Reference counting frees everything
acyclic either way, but each full collection rescans every tracked object, and the collector
runs one whenever the long-lived objects have grown by a quarter: a sizeable share of a search's
time. Young collections go on (they are cheap and free the few cycles a search makes while they
are young); only the full ones wait until the search ends. Measurements and commands:
docs/search-history.md, "Garbage collection" and "Numbers moved from the docstrings".
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: a threshold for the oldest generation that is never reached (young collections between
#: two full ones; CPython compares it with a C long)
NEVER = 2**31 - 1


def hold_full_collections() -> None:
    """From now on, no automatic full collections (young ones go on)."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, NEVER)


_lock = threading.Lock()
_depth = 0  # blocks open now, in any thread
_saved: tuple[int, ...] = ()  # the thresholds the first of them found


@contextmanager
def full_collections_held() -> Iterator[None]:
    """No automatic full collections inside the block. The thresholds are process-wide, so
    blocks are counted: the first to open holds full collections back, the last to close
    restores what the first found (nested blocks and searches in several threads are fine)."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            hold_full_collections()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.set_threshold(*_saved)
