"""Specs of hardware, models, workloads and clusters, and the paper's presets."""

from hetrl.spec.cluster import ClusterSpec, Device, NodeSpec, RegionLink
from hetrl.spec.hardware import GPUType, gpu_catalog, gpu_type
from hetrl.spec.lengths import LengthDist
from hetrl.spec.model import ModelShape, model_preset, model_presets
from hetrl.spec.tasks import TASK_NAMES, TaskInfo, tasks_for
from hetrl.spec.workload import WorkloadSpec

__all__ = [
    "TASK_NAMES",
    "ClusterSpec",
    "Device",
    "GPUType",
    "LengthDist",
    "ModelShape",
    "NodeSpec",
    "RegionLink",
    "TaskInfo",
    "WorkloadSpec",
    "gpu_catalog",
    "gpu_type",
    "model_preset",
    "model_presets",
    "tasks_for",
]
