"""The public measurement rows (docs/validation.md, "How a row is expressed"): reading
``experiments/public/<id>.yaml`` and building each row's workload, cluster (with the padding
node of a component row) and plan; experiments/validate_public.py prices and compares them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from experiments.unknown_lengths import LENGTHS
from hetrl.plan import Plan, Provenance, TaskGroup, TaskPlacement, make_placement, validate_layout
from hetrl.plan import validate as validate_plan
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

ROOT = Path(__file__).resolve().parent.parent
ROWS_DIR = ROOT / "experiments" / "public"
GPUS_FILE = ROWS_DIR / "gpus.yaml"

KINDS = ("step", "gen", "fwd", "train", "sync")
SPLITS = ("fit", "holdout")
#: The padding node: one device that holds whatever a component row does not measure.
PADDING_GPU = {"name": "padding", "bf16_tflops": 1e5, "fp8_tflops": 1e5, "memory_gb": 1e4,
               "hbm_gbps": 1e5, "intra_link": "nvlink", "intra_link_gbps": 1e4, "node_nic_gbps": 1e5,
               "source": "validate_public.py: holds the tasks a component row does not measure"}
#: Placement fields a row may set beyond the layout, and what they stand for.
PLACEMENT_EXTRAS = {"backend": "ZeRO-3/FSDP sharding of the trained states",
                    "offload": "FSDP parameter and optimizer offload to host memory",
                    "ep": "expert parallelism of a mixture-of-experts model"}
COMPARE_KEYS = {"label", "quantity", "value", "unit", "gpus", "epoch_samples", "megatron"}
ROW_KEYS = {"id", "kind", "split", "source", "source_key", "skip", "workload", "cluster",
            "padding", "layout", "exclude_tasks", "compare", "gaps", "lengths", "pair_of"}


class RowError(Exception):
    """A row that cannot be estimated (a missing hetrl feature, a bad row file): reported as
    skipped with this message, never fatal to the run."""


@dataclass(frozen=True)
class Row:
    """One measurement row as written in ``experiments/public/<id>.yaml``."""

    id: str
    kind: str
    split: str
    source: str
    source_key: str
    path: Path
    skip: str | None = None
    workload: Mapping[str, Any] = field(default_factory=dict)
    cluster: Mapping[str, Any] = field(default_factory=dict)
    padding: bool = False
    layout: Mapping[str, Any] = field(default_factory=dict)
    exclude_tasks: tuple[str, ...] = ()
    compare: tuple[Mapping[str, Any], ...] = ()
    gaps: str = ""
    #: "published" (the source gives mean lengths) or "unknown" (only caps: reported apart)
    lengths: str = "published"
    #: the row measuring the same job on another GPU type (issue 58, item 3): the two rows'
    #: ratio of estimates is held against their ratio of measurements
    pair_of: str | None = None



# --- rows ------------------------------------------------------------------------------------

def load_row(path: Path) -> Row:
    """One row file; a missing or unknown key is a :class:`RowError` naming the file."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, Mapping):
        raise RowError(f"{path.name}: not a mapping")
    unknown = set(data) - ROW_KEYS
    if unknown:
        raise RowError(f"{path.name}: unknown keys {sorted(unknown)}")
    for key in ("id", "kind", "split", "source", "source_key"):
        if key not in data:
            raise RowError(f"{path.name}: '{key}' is required")
    if data["kind"] not in KINDS or data["split"] not in SPLITS:
        raise RowError(f"{path.name}: kind must be one of {KINDS}, split one of {SPLITS}")
    if data.get("lengths", "published") not in LENGTHS:
        raise RowError(f"{path.name}: lengths must be one of {LENGTHS}")
    if data["id"] != path.stem:
        raise RowError(f"{path.name}: id {data['id']!r} differs from the file name")
    if not data.get("skip"):
        for key in ("workload", "cluster", "layout", "compare"):
            if not data.get(key):
                raise RowError(f"{path.name}: '{key}' is required unless the row is skipped")
    for i, comp in enumerate(data.get("compare") or []):
        bad = set(comp) - COMPARE_KEYS if isinstance(comp, Mapping) else {"(not a mapping)"}
        if bad or not {"quantity", "value"} <= set(comp):
            raise RowError(f"{path.name}: compare[{i}] needs quantity and value and knows only "
                           f"{sorted(COMPARE_KEYS)}; got {sorted(map(str, comp))}")
    return Row(id=str(data["id"]), kind=data["kind"], split=data["split"],
               source=str(data["source"]), source_key=str(data["source_key"]), path=path,
               skip=data.get("skip") or None, workload=data.get("workload") or {},
               cluster=data.get("cluster") or {}, padding=bool(data.get("padding", False)),
               layout=data.get("layout") or {},
               exclude_tasks=tuple(data.get("exclude_tasks") or ()),
               compare=tuple(data.get("compare") or ()), gaps=str(data.get("gaps") or ""),
               lengths=data.get("lengths", "published"),
               pair_of=str(data["pair_of"]) if data.get("pair_of") else None)


def _order(row_id: str) -> tuple[int, int, str]:
    prefix = "SGFTW".find(row_id[:1])
    digits = "".join(ch for ch in row_id[1:] if ch.isdigit())
    return (prefix if prefix >= 0 else 9, int(digits) if digits else 0, row_id)


def load_rows(directory: Path = ROWS_DIR) -> list[Row]:
    """Every row file of ``directory`` (``gpus.yaml`` is not a row), in table order."""
    paths = [p for p in directory.glob("*.yaml") if p.name != GPUS_FILE.name]
    return sorted((load_row(p) for p in paths), key=lambda r: _order(r.id))


def _gpu_types() -> list[dict[str, Any]]:
    return list(yaml.safe_load(GPUS_FILE.read_text())["gpu_types"])


# --- specs and plan --------------------------------------------------------------------------

def _has_field(cls: type, name: str) -> bool:
    return name in {f.name for f in dataclasses.fields(cls)}


def build_workload(row: Row) -> WorkloadSpec:
    """The row's workload. ``recompute_logprobs`` (the actor's old-log-prob forward) is passed
    when hetrl knows it; a row that needs it on a hetrl without it is a :class:`RowError`."""
    data = dict(row.workload)
    data.setdefault("name", f"public-{row.id}")
    wants = bool(data.pop("recompute_logprobs", False))
    if _has_field(WorkloadSpec, "recompute_logprobs"):
        data["recompute_logprobs"] = wants
    elif wants:
        raise RowError("needs WorkloadSpec.recompute_logprobs (the actor_inference task, verl's "
                       "old_log_prob), which this hetrl does not have yet")
    return WorkloadSpec.from_dict(data, base_dir=row.path.parent)


def build_cluster(row: Row) -> tuple[ClusterSpec, int]:
    """The row's cluster plus, for component rows, the padding node after its devices; and the
    number of measured devices (the padding device's id)."""
    data = dict(row.cluster)
    data.setdefault("name", f"public-{row.id}")
    data["gpu_types"] = list(data.get("gpu_types") or []) + _gpu_types()
    measured = ClusterSpec.from_dict(data).num_devices
    if row.padding:
        data["gpu_types"].append(PADDING_GPU)
        data["nodes"] = list(data["nodes"]) + [
            {"name": "padding", "gpu": "padding", "count": 1, "nic_gbps": 1e5}]
    return ClusterSpec.from_dict(data), measured


def _device_ids(spec: Any, n: int, where: str) -> list[int]:
    """``"all"``, ``"a-b"`` (inclusive), an integer or a list of ids."""
    if spec == "all":
        return list(range(n))
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, str) and "-" in spec:
        lo, hi = (int(x) for x in spec.split("-"))
        return list(range(lo, hi + 1))
    if isinstance(spec, list) and all(isinstance(d, int) for d in spec):
        return list(spec)
    raise RowError(f"{where}: devices {spec!r} must be 'all', 'a-b', an id or a list of ids")


def _placement(task: str, devices: list[int], spec: Mapping[str, Any], workload: WorkloadSpec,
               where: str) -> TaskPlacement:
    tp, pp = int(spec.get("tp", 1)), int(spec.get("pp", 1))
    if len(devices) % (tp * pp):
        raise RowError(f"{where}: tp*pp = {tp * pp} does not divide its {len(devices)} devices")
    dp = len(devices) // (tp * pp)
    model = workload.model(workload.task(task).role)
    validate_layout(model, tp, pp, where)
    p = make_placement(task, devices, dp, pp, tp, model.layers)
    extras = {k: spec[k] for k in PLACEMENT_EXTRAS if k in spec}
    for key, value in extras.items():
        if not _has_field(TaskPlacement, key):
            raise RowError(f"needs TaskPlacement.{key} = {value!r} for {task} "
                           f"({PLACEMENT_EXTRAS[key]}), which this hetrl does not have yet")
    return dataclasses.replace(p, **extras) if extras else p


def build_plan(row: Row, workload: WorkloadSpec, cluster: ClusterSpec, measured: int) -> Plan:
    """Task groups from ``layout.groups`` (each task spans its group's devices); per task
    ``tp``/``pp``/``backend``/``offload``/``ep`` from ``layout.placements`` (``default`` for the others; dp fills
    the group). Tasks in no group go to the padding device (component rows only)."""
    names = list(workload.task_names)
    specs = row.layout.get("placements") or {}
    groups, placements, placed = [], [], set()
    for gi, g in enumerate(row.layout.get("groups") or []):
        where = f"{row.id}: layout.groups[{gi}]"
        tasks = names if g.get("tasks") == "all" else list(g.get("tasks") or [])
        missing = [t for t in tasks if t not in names]
        if missing:
            raise RowError(f"{where}: {missing} not tasks of this workload ({names})")
        tasks = [t for t in tasks if t not in placed]
        devices = _device_ids(g.get("devices", "all"), measured, where)
        for t in tasks:
            spec = {**(specs.get("default") or {}), **(specs.get(t) or {})}
            placements.append(_placement(t, devices, spec, workload, f"{where}.{t}"))
            placed.add(t)
        groups.append(TaskGroup(tuple(tasks), tuple(devices)))
    rest = [t for t in names if t not in placed]
    if rest:
        if not row.padding:
            raise RowError(f"{row.id}: tasks {rest} are in no group (and the row has no padding)")
        pad = measured
        for t in rest:
            placements.append(make_placement(t, [pad], 1, 1, 1,
                                             workload.model(workload.task(t).role).layers))
        groups.append(TaskGroup(tuple(rest), (pad,)))
    order = {t: i for i, t in enumerate(names)}
    plan = Plan(tuple(groups), tuple(sorted(placements, key=lambda p: order[p.task])),
                Provenance(scheduler="manual", note=f"public validation row {row.id}"))
    validate_plan(plan, workload, cluster)
    return plan
