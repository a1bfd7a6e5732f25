"""GPU types: datasheet facts (see ``hetrl/data/gpus.yaml`` for sources)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from hetrl.errors import SpecError, did_you_mean, find_name, positive, require, string

INTRA_LINK_KINDS = ("nvlink", "pcie")
MIB = 2**20  # bytes
#: The GPU types of the paper's testbed and the catalog's first entries: random clusters draw
#: from these unless told otherwise (the catalog's later types, H20 to RTX-4090, came with
#: issue 57).
PAPER_GPU_TYPES = ("A100-80GB", "A100-40GB", "H100", "H200", "L40S", "L4", "A10G")


@dataclass(frozen=True)
class GPUType:
    """One GPU model.

    Units: ``bf16_tflops`` dense bf16 TFLOPS (1e12 FLOP/s); ``fp8_tflops`` dense FP8 TFLOPS
    (0: the type has no FP8 tensor cores); ``memory_gb`` the marketed memory, GB (1e9 bytes);
    ``memory_mib`` the total the driver reports (nvidia-smi), MiB (2^20 bytes; 0: not known,
    the marketed figure is used): an "80 GB" HBM part has 81,920 or 81,559 MiB, 85.9 or 85.5e9
    bytes, while ECC-on GDDR parts report about their marketed GB;
    ``hbm_gbps`` memory bandwidth GB/s (1e9 bytes/s); ``intra_link_gbps`` GPU<->GPU bandwidth
    inside a node, GB/s per direction; ``node_nic_gbps`` default node network, Gbit/s.
    """

    name: str
    bf16_tflops: float
    memory_gb: float
    hbm_gbps: float
    intra_link: str = "pcie"
    intra_link_gbps: float = 32.0
    node_nic_gbps: float = 100.0
    source: str = ""
    fp8_tflops: float = 0.0
    memory_mib: float = 0.0

    @property
    def flops(self) -> float:
        """Peak dense bf16 FLOP/s."""
        return self.bf16_tflops * 1e12

    @property
    def fp8_flops(self) -> float:
        """Peak dense FP8 FLOP/s (0: no FP8 tensor cores)."""
        return self.fp8_tflops * 1e12

    @property
    def has_fp8(self) -> bool:
        return self.fp8_tflops > 0

    @property
    def memory_bytes(self) -> float:
        """The device's memory in bytes: the driver's total where known, else the marketed."""
        return self.memory_mib * MIB if self.memory_mib else self.memory_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbps * 1e9

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("fp8_tflops", "memory_mib"):  # (unset: the type reads as it always did)
            if not out[key]:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "gpu") -> GPUType:
        require(isinstance(data, Mapping), field, data, "must be a mapping")
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        first = sorted(extra)[0] if extra else None
        require(not extra, f"{field}.{first}" if extra else field,
                data.get(first) if extra else None, f"unknown key; known keys: {sorted(known)}")
        for key in ("name", "bf16_tflops", "memory_gb", "hbm_gbps"):
            require(key in data, f"{field}.{key}", None, "is required")
        name = data["name"]
        require(isinstance(name, str) and name.strip() != "", f"{field}.name", name,
                "must be a non-empty string")
        kind = data.get("intra_link", "pcie")
        require(kind in INTRA_LINK_KINDS, f"{field}.intra_link", kind,
                f"must be one of {list(INTRA_LINK_KINDS)}")
        tflops = positive(f"{field}.bf16_tflops", data["bf16_tflops"])
        require(tflops <= 1e5, f"{field}.bf16_tflops", tflops, "must be <= 1e5 TFLOPS (units: TFLOPS)")
        mem = positive(f"{field}.memory_gb", data["memory_gb"])
        require(mem <= 1e4, f"{field}.memory_gb", mem, "must be <= 1e4 GB (units: GB)")
        hbm = positive(f"{field}.hbm_gbps", data["hbm_gbps"])
        require(hbm <= 1e5, f"{field}.hbm_gbps", hbm, "must be <= 1e5 GB/s (units: GB/s)")
        return cls(
            name=name,
            bf16_tflops=tflops,
            memory_gb=mem,
            hbm_gbps=hbm,
            intra_link=kind,
            intra_link_gbps=positive(f"{field}.intra_link_gbps", data.get("intra_link_gbps", 32.0),
                                     1e5),
            node_nic_gbps=positive(f"{field}.node_nic_gbps", data.get("node_nic_gbps", 100.0), 1e5),
            source=string(f"{field}.source", data.get("source", ""), nonempty=False),
            fp8_tflops=_fp8_tflops(f"{field}.fp8_tflops", data.get("fp8_tflops", 0.0)),
            memory_mib=_memory_mib(f"{field}.memory_mib", data.get("memory_mib", 0.0), mem),
        )


def _memory_mib(field: str, value: Any, memory_gb: float) -> float:
    """The driver's total memory, MiB: 0 (unknown) or within 0.9-1.2 x the marketed
    ``memory_gb`` (a figure further off is a units slip: GB for MiB, or the other way)."""
    if value == 0 and not isinstance(value, bool):
        return 0.0
    mib = positive(field, value, 1e7)
    ratio = mib * MIB / (memory_gb * 1e9)
    require(0.9 <= ratio <= 1.2, field, value,
            f"must be within 0.9-1.2 x memory_gb ({memory_gb:g} GB = {memory_gb * 1e9 / MIB:,.0f} "
            f"MiB): the total nvidia-smi reports, in MiB (2^20 bytes)")
    return mib


def _fp8_tflops(field: str, value: Any) -> float:
    """Dense FP8 TFLOPS: 0 (no FP8 units) or positive, at most 1e5."""
    if value == 0 and not isinstance(value, bool):
        return 0.0
    return positive(field, value, 1e5)


@lru_cache(maxsize=1)
def _catalog_file() -> tuple[dict[str, GPUType], dict[str, str]]:
    text = resources.files("hetrl.data").joinpath("gpus.yaml").read_text()
    raw = yaml.safe_load(text)
    types = {}
    for i, entry in enumerate(raw["gpus"]):
        gpu = GPUType.from_dict(entry, field=f"gpus.yaml:gpus[{i}]")
        types[gpu.name] = gpu
    return types, dict(raw.get("aliases", {}))


def gpu_catalog() -> dict[str, GPUType]:
    """The built-in GPU types by name."""
    return dict(_catalog_file()[0])


def gpu_aliases() -> dict[str, str]:
    """Short names accepted for built-in types (e.g. ``A100`` -> ``A100-80GB``)."""
    return dict(_catalog_file()[1])


def gpu_type(name: str, extra: Iterable[GPUType] = (), field: str = "gpu") -> GPUType:
    """Resolve a GPU type by name (or alias), looking at ``extra`` user types first; names match
    case-insensitively (``l40s`` is ``L40S``) when no name matches exactly, and a miss suggests
    the closest names."""
    if not isinstance(name, str):
        raise SpecError(field, name, "must be a string (a GPU type's name)")
    extra = tuple(extra)
    types, aliases = _catalog_file()
    users = {g.name: g for g in extra}
    # exact first (a user type shadows a built-in of the same name), then ignoring case
    for table in (users, types, aliases):
        if name in table:
            return _resolved(table[name], types)
    for table in (users, types, aliases):
        hit = find_name(name, table)
        if hit is not None:
            return _resolved(table[hit], types)
    known = sorted(set(types) | set(aliases) | set(users))
    raise SpecError(field, name, f"unknown GPU type; known: {', '.join(known)}"
                                 f"{did_you_mean(name, known)} (names match in any case; define "
                                 "another type under gpu_types)")


def _resolved(entry: GPUType | str, types: Mapping[str, GPUType]) -> GPUType:
    """A user or catalog type as is; an alias as the catalog type it names."""
    return types[entry] if isinstance(entry, str) else entry
