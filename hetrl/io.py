"""The only place that reads and writes files: specs and plans from YAML/JSON, atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from hetrl.errors import HetrlError, SpecError
from hetrl.plan import Plan
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.presets import CLUSTER_PRESETS, WORKLOAD_PRESETS, cluster_preset, workload_preset
from hetrl.spec.workload import WorkloadSpec


def read_mapping(path: str | Path, what: str = "file") -> dict[str, Any]:
    """Parse a YAML or JSON file (JSON is YAML) into a mapping; errors name the file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(what, str(p), f"cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(what, str(p), f"malformed {p.suffix.lstrip('.') or 'YAML'}: {first}") from None
    if not isinstance(data, dict):
        raise SpecError(what, str(p), "must contain a mapping at the top level")
    return data


def _in_file(path: Path, exc: HetrlError) -> HetrlError:
    if isinstance(exc, SpecError):
        return SpecError(f"{path.name}: {exc.field}", exc.value, exc.problem)
    return exc


def _load_spec(ref: str | Path, what: str, presets: Mapping[str, Any],
               from_preset: Callable[[str], Any], from_dict: Callable[..., Any]) -> Any:
    """A spec from a preset name or a YAML/JSON file; errors name the file."""
    if str(ref) in presets:
        return from_preset(str(ref))
    p = Path(ref)
    if not p.exists():
        raise SpecError(what, str(ref), f"neither a preset nor a file; presets: {', '.join(presets)}")
    try:
        return from_dict(read_mapping(p, what), base_dir=p.parent)
    except HetrlError as exc:
        raise _in_file(p, exc) from None


def load_workload(ref: str | Path) -> WorkloadSpec:
    """A workload from a preset name or a YAML/JSON file."""
    return _load_spec(ref, "workload", WORKLOAD_PRESETS, workload_preset, WorkloadSpec.from_dict)


def load_cluster(ref: str | Path) -> ClusterSpec:
    """A cluster from a preset name or a YAML/JSON file."""
    return _load_spec(ref, "cluster", CLUSTER_PRESETS, cluster_preset, ClusterSpec.from_dict)


def load_plan(path: str | Path) -> Plan:
    p = Path(path)
    try:
        return Plan.from_dict(read_mapping(p, "plan"))
    except HetrlError as exc:
        raise _in_file(p, exc) from None


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: never a truncated file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def dump(data: Any, path: str | Path) -> None:
    """Write a mapping as JSON (``.json``) or YAML (anything else), atomically."""
    p = Path(path)
    if p.suffix == ".json":
        write_text_atomic(p, json.dumps(data, indent=2) + "\n")
    else:
        write_text_atomic(p, yaml.safe_dump(data, sort_keys=False))


def save_plan(plan: Plan, path: str | Path) -> None:
    dump(plan.to_dict(), path)
