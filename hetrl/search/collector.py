"""Python's cyclic garbage collector, paused while a search runs.

A search fills the cost model's memos with millions of long-lived, acyclic objects (placements,
tuples, arrays) and makes almost no reference cycles: after 25,000 evaluations of HetRL on
paper64 with the collector off, ``gc.collect()`` found 844 cyclic objects among 1.4 million
tracked ones (3.5 million for HetRL (simple)). Reference counting frees everything acyclic
either way. But each full collection rescans every tracked object, and the collector runs one
whenever the long-lived objects have grown by a quarter: timed with ``gc.callbacks``, the
collections took 15% of that search's time (5.7 s of 16 full collections, 1.3 s of young ones,
in 45.6 s) and 18% of HetRL (simple)'s. Measurements and command: docs/search-history.md,
"Garbage collection".
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block and restore its previous state after
    (nested blocks are fine: the outermost one re-enables it)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
