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


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key repeated in one mapping is an error (the last
    one would silently win: a typo must never pass silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: PyYAML's own error says so
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict; a repeated name is an error (as for YAML)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise json.JSONDecodeError(f"duplicate key {key!r}", "", 0)
        out[key] = value
    return out


def _where(exc: Exception) -> str:
    """' at line L, column C' of a parse error, where the parser says."""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f" at line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(exc, json.JSONDecodeError) and exc.doc:
        return f" at line {exc.lineno}, column {exc.colno}"
    return ""


def read_mapping(path: str | Path, what: str = "file") -> dict[str, Any]:
    """Parse a YAML or JSON file (JSON is YAML) into a mapping; errors name the file, and for
    malformed text the line and column."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(what, str(p), "cannot read: not UTF-8 text") from None
    except OSError as exc:
        raise SpecError(what, str(p), f"cannot read: {exc.strerror or exc}") from None
    try:
        data = (json.loads(text, object_pairs_hook=_unique_pairs) if p.suffix == ".json"
                else yaml.load(text, _UniqueKeyLoader))
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        if isinstance(exc, json.JSONDecodeError):
            problem = exc.msg
        else:
            problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SpecError(what, str(p), f"malformed {p.suffix.lstrip('.') or 'YAML'}: {problem}"
                                      f"{_where(exc)}") from None
    if not isinstance(data, dict):
        raise SpecError(what, str(p), "must contain a mapping at the top level")
    return data


def _in_file(path: Path, exc: HetrlError) -> HetrlError:
    if isinstance(exc, SpecError) and exc.value != str(path):  # (else it names the file)
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


def load_plan(path: str | Path, workload: WorkloadSpec | None = None,
              cluster: ClusterSpec | None = None) -> Plan:
    """A plan from a YAML/JSON file; with ``workload`` and ``cluster`` also validated against
    them. Errors name the file."""
    from hetrl.plan import validate

    p = Path(path)
    try:
        plan = Plan.from_dict(read_mapping(p, "plan"))
        if workload is not None and cluster is not None:
            validate(plan, workload, cluster)
        return plan
    except HetrlError as exc:
        raise _in_file(p, exc) from None


def _nearest_existing(p: Path) -> Path:
    """``p`` or its nearest ancestor that exists (where a missing folder would be created)."""
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _cannot_create_in(folder: Path) -> str | None:
    """None if a file can be created in ``folder``, else the OS's reason. A real try (a
    temporary file, removed at once): permission bits do not show a read-only mount, /proc or
    /sys, an immutable folder, or a full disk's inode table -- and root passes every bit."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".hetrl-probe.", suffix=".tmp", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(tmp)
    return None


def check_output_path(path: str | Path, field: str, probe: bool = True) -> Path:
    """``path`` as a Path if a file can be written there (checked before long work, so that a
    bad ``--out`` fails at once, not after the search): not a directory nor a special file, not
    an unwritable (read-only or immutable) file, and its nearest existing ancestor a directory
    where a file can be created -- with ``probe``, by creating one (see
    :func:`_cannot_create_in`). ``field`` names the option in the error."""
    p = Path(path)
    if not str(path):
        raise SpecError(field, str(path), "must be a file path, not empty")
    if p.is_dir():
        raise SpecError(field, str(path), "is a directory; give a file path")
    if p.exists() and not p.is_file():
        raise SpecError(field, str(path), "is not a regular file (a device, pipe or socket)")
    if p.exists() and not os.access(p, os.W_OK):
        raise SpecError(field, str(path), "cannot overwrite it: the file is read-only or "
                                          "immutable")
    parent = _nearest_existing(p.parent)
    if not parent.is_dir():
        raise SpecError(field, str(path), f"cannot create it: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SpecError(field, str(path), f"cannot create it: {parent} is not writable")
    reason = _cannot_create_in(parent) if probe else None
    if reason:
        raise SpecError(field, str(path), f"cannot create files in {parent}: {reason}")
    return p


def check_output_dir(path: str | Path, field: str) -> Path:
    """``path`` as a Path if files can be written in it (checked before long work): an
    existing directory where a file can be created, or a missing one whose nearest existing
    ancestor is such a directory (it is created when first written, not here). Not a file."""
    p = Path(path)
    if not str(path):
        raise SpecError(field, str(path), "must be a directory path, not empty")
    if p.exists() and not p.is_dir():
        raise SpecError(field, str(path), "is a file, not a directory")
    where = _nearest_existing(p)
    if not where.is_dir():
        raise SpecError(field, str(path), f"cannot create it: {where} is not a directory")
    reason = _cannot_create_in(where)
    if reason:
        raise SpecError(field, str(path), f"cannot create files in {where}: {reason}")
    return p


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (setting it to read
    it would race with other threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | Path, text: str, field: str = "output") -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: never a truncated file. The
    file gets the usual permissions (0666 less the umask), not the temporary file's 0600. An OS
    error (permission, full disk, read-only mount) is a :class:`SpecError` naming ``field``
    and the path: one line at the command line, exit 2."""
    p = check_output_path(path, field, probe=False)
    tmp = None
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise SpecError(field, str(p), f"cannot write: {exc.strerror or exc}") from None
        raise


def dump(data: Any, path: str | Path, field: str = "output") -> None:
    """Write a mapping as JSON (``.json``) or YAML (anything else), atomically; an OS error
    names ``field``."""
    p = Path(path)
    if p.suffix == ".json":
        write_text_atomic(p, json.dumps(data, indent=2) + "\n", field)
    else:
        write_text_atomic(p, yaml.safe_dump(data, sort_keys=False), field)


def save_plan(plan: Plan, path: str | Path, field: str = "output") -> None:
    dump(plan.to_dict(), path, field)
