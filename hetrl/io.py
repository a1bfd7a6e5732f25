"""The only place that reads and writes files: specs and plans from YAML/JSON, atomic writes.

Every file is read through :func:`read_data`: size-capped, UTF-8, no YAML aliases, bounded
nesting, unique string keys (hetrl.limits holds the caps; docs/reliability.md explains them).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from hetrl.errors import HetrlError, SpecError, did_you_mean
from hetrl.limits import MAX_FILE_BYTES, MAX_NESTING, MAX_YAML_BYTES
from hetrl.plan import Plan
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.presets import (
    CLUSTER_PRESETS,
    WORKLOAD_PRESETS,
    cluster_preset,
    preset_name,
    workload_preset,
)
from hetrl.spec.workload import WorkloadSpec

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where present


class _StrictLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """PyYAML's safe loader, except that a mapping's keys must be strings and a key repeated in
    one mapping is an error (the last one would silently win: a typo must never pass silently).
    Aliases and deep nesting are refused before this loader runs (:func:`_check_events`)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[str] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, f"keys must be strings, not {type(key).__name__} "
                    f"({key_node.value!r:.40}: quote it)", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# Numbers as people type them: YAML 1.1 (PyYAML) reads a float only with a dot and a signed
# exponent, so ``1e-3``, ``1E5`` or ``2.5e9`` came out as strings; YAML 1.2 and JSON read them
# as numbers, and so does hetrl. Only the exponent forms are added: plain integers keep their
# resolver (which runs first), and the new form needs the exponent.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _check_events(text: str) -> None:
    """Refuse aliases (``*name``: an alias bomb expands a few hundred bytes into gigabytes) and
    nesting deeper than :data:`MAX_NESTING`, scanning the parser's events (no recursion)."""
    depth = 0
    for event in yaml.parse(text, Loader=_BaseLoader):
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not accepted: write the value out",
                event.start_mark)
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_NESTING} levels", event.start_mark)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict; a repeated name is an error (as for YAML)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise json.JSONDecodeError(f"duplicate key {key!r}", "", 0)
        out[key] = value
    return out


def _nesting(data: Any) -> int:
    """How deeply lists and mappings nest in ``data`` (iteratively: no recursion to blow up)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _where(exc: Exception) -> str:
    """' at line L, column C' of a parse error, where the parser says."""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f" at line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(exc, json.JSONDecodeError) and exc.doc:
        return f" at line {exc.lineno}, column {exc.colno}"
    return ""


def _read_bytes(p: Path, what: str, cap: int) -> bytes:
    """At most ``cap`` bytes of ``p``; more is an error (read bounded: /dev/zero ends too)."""
    try:
        with p.open("rb") as fh:
            raw = fh.read(cap + 1)
    except OSError as exc:
        raise SpecError(what, str(p), f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > cap:
        raise SpecError(what, str(p), f"file is larger than {cap:,} bytes, the limit for "
                                      f"{'JSON' if cap == MAX_FILE_BYTES else 'YAML (write JSON)'}")
    return raw


def parse_text(text: str, is_json: bool) -> Any:
    """A YAML or JSON document as Python data, refusing aliases, deep nesting, repeated keys and
    (YAML) keys that are not strings. Raises ``ValueError`` (json/yaml's errors included) or
    ``yaml.YAMLError`` with the parser's message."""
    if is_json:
        try:
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        except RecursionError:
            raise ValueError(f"nested deeper than {MAX_NESTING} levels") from None
    else:
        _check_events(text)
        data = yaml.load(text, _StrictLoader)  # noqa: S506 -- a SafeLoader subclass
    if _nesting(data) > MAX_NESTING:
        raise ValueError(f"nested deeper than {MAX_NESTING} levels")
    return data


def read_data(path: str | Path, what: str = "file") -> Any:
    """Parse a YAML or JSON file (``.json``: JSON; anything else: YAML, of which JSON is a
    subset) safely: at most :data:`MAX_FILE_BYTES` (JSON) or :data:`MAX_YAML_BYTES` (YAML), UTF-8,
    no aliases, nesting at most :data:`MAX_NESTING`. Every problem is one :class:`SpecError`
    naming the file (``what`` names the kind of file), and for malformed text the line and
    column. The one function every file reader uses."""
    p = Path(path)
    is_json = p.suffix.lower() == ".json"
    raw = _read_bytes(p, what, MAX_FILE_BYTES if is_json else MAX_YAML_BYTES)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SpecError(what, str(p), "cannot read: not UTF-8 text") from None
    try:
        return parse_text(text, is_json)
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError) as exc:
        if isinstance(exc, json.JSONDecodeError):
            problem = exc.msg
        elif isinstance(exc, yaml.YAMLError):
            problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        else:  # a number with too many digits, nesting too deep
            problem = (str(exc).splitlines() or [type(exc).__name__])[0].split(";")[0]
        raise SpecError(what, str(p), f"malformed {p.suffix.lstrip('.') or 'YAML'}: "
                                      f"{problem}{_where(exc)}") from None


def read_mapping(path: str | Path, what: str = "file") -> dict[str, Any]:
    """:func:`read_data` of a file that must hold a mapping at the top level."""
    data = read_data(path, what)
    if not isinstance(data, dict):
        raise SpecError(what, str(path), "must contain a mapping at the top level")
    return data


def _in_file(path: Path, exc: HetrlError) -> HetrlError:
    if isinstance(exc, SpecError) and exc.value != str(path):  # (else it names the file)
        return type(exc)(f"{path.name}: {exc.field}", exc.value, exc.problem)
    return exc


def _load_spec(ref: str | Path, what: str, presets: Mapping[str, Any],
               from_preset: Callable[[str], Any], from_dict: Callable[..., Any]) -> Any:
    """A spec from a preset name or a YAML/JSON file; errors name the file."""
    if str(ref) in presets:
        return from_preset(str(ref))
    p = Path(ref)
    if not p.exists():
        if preset_name(str(ref), presets) is not None:  # a preset name typed in another case
            return from_preset(str(ref))
        raise SpecError(what, str(ref), f"neither a preset nor a file; presets: {', '.join(presets)}"
                                        f"{did_you_mean(str(ref), presets)}")
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


def spec_name(ref: str | Path) -> str:
    """The human name of a ``-w``/``-c`` reference: the preset's name, or the file's name."""
    for presets in (WORKLOAD_PRESETS, CLUSTER_PRESETS):
        if str(ref) in presets or (not Path(ref).exists()
                                   and preset_name(str(ref), presets) is not None):
            return preset_name(str(ref), presets) or str(ref)
    return Path(ref).name


def load_plan(path: str | Path, workload: WorkloadSpec | None = None,
              cluster: ClusterSpec | None = None, *, workload_name: str | None = None,
              cluster_name: str | None = None, allow_mismatch: bool = False,
              warn: Callable[[str], None] | None = None) -> Plan:
    """A plan from a YAML/JSON file; with ``workload`` and ``cluster`` also checked to be the
    ones it was made for (:func:`hetrl.fingerprint.check_plan_for`: a
    :class:`~hetrl.errors.PlanMismatchError` unless ``allow_mismatch``; the names default to
    the specs') and validated against them. ``warn`` gets the check's one-line warning (a plan
    without fingerprints, an allowed mismatch) once the plan is valid. Errors name the file."""
    from hetrl.fingerprint import check_plan_for
    from hetrl.plan import validate

    p = Path(path)
    try:
        plan = Plan.from_dict(read_mapping(p, "plan"))
        if workload is not None and cluster is not None:
            note = check_plan_for(plan.made_for, workload, cluster, workload_name,
                                  cluster_name, allow_mismatch)
            validate(plan, workload, cluster)
            if note is not None and warn is not None:  # (a refusal stays one line)
                warn(f"{p.name}: {note}")
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


def write_text_atomic(path: str | Path, text: str, field: str = "output",
                      executable: bool = False) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: never a truncated file. The
    file gets the usual permissions (0666 less the umask; ``executable``: 0777 less the umask,
    set before the rename), not the temporary file's 0600. An OS error (permission, full disk,
    read-only mount) is a :class:`SpecError` naming ``field`` and the path: one line at the
    command line, exit 2."""
    write_bytes_atomic(path, text.encode("utf-8"), field, executable)


def write_bytes_atomic(path: str | Path, data: bytes, field: str = "output",
                       executable: bool = False) -> None:
    """:func:`write_text_atomic` for bytes (pictures)."""
    p = check_output_path(path, field, probe=False)
    tmp = None
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        os.fchmod(fd, (0o777 if executable else 0o666) & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
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
    """Write ``plan`` (with its ``made_for`` fingerprints, where it has them) atomically."""
    dump(plan.to_dict(), path, field)
