"""Values an export takes from user or stranger files (model names and paths, cluster, node and
GPU names, file names), checked before they reach another framework's config or command line.

The exporters quote every value they write (``shlex.quote`` for the shell, the config
language's own quoting inside it) and paste no string into code; what no framework accepts at
all is refused here, with the project's error (field, value, limit; exit 2 at the CLI)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hetrl.errors import SpecError

#: The limit every checked string must meet, as the error states it.
PROBLEM = ("must not hold control characters (newline, carriage return, NUL, ...): no "
           "framework's config or command line accepts them")


def text(field: str, value: Any) -> str:
    """``value`` (made a string) if it holds no control character, else raise SpecError."""
    s = str(value)
    if any(not c.isprintable() and c != " " for c in s):
        raise SpecError(field, s, PROBLEM)
    return s


def check_inputs(workload, cluster, plan_path: Any, extra: Iterable[tuple[str, Any]] = ()) -> None:
    """Refuse any name an export would write that no framework accepts: the workload's and the
    cluster's names, every model name, node name and GPU type, the plan's file name, and the
    ``extra`` (field, value) pairs (e.g. ``--model-path``)."""
    text("workload.name", workload.name)
    text("cluster.name", cluster.name)
    for role, shape in workload.models:
        text(f"models.{role}.name", shape.name)
    for i, node in enumerate(cluster.nodes):
        text(f"nodes[{i}].name", node.name)
        text(f"nodes[{i}].gpu", node.gpu)
    text("--plan", plan_path)
    for field, value in extra:
        text(field, value)
