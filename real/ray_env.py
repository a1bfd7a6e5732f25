"""One way to start (or join) Ray for the real backend, with emulated device resources.

On a CPU machine a plan that names A100s and L4s runs by giving the local Ray instance custom
resources ``accelerator_type:<GPU>`` (one unit per planned device of that type); every device
worker asks for a small share of its type's resource, so Ray places it only where that type
exists. On a GPU cluster start Ray with the same resource names, e.g.
``ray start --resources '{"accelerator_type:A100-80GB": 8}'`` (Ray's own ``accelerator_type:*``
names, such as ``A100``, differ from the catalog's).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the rendezvous of a local torch.distributed
    world)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Units of each built-in GPU type a local instance emulates (devices of that type per plan).
EMULATED_PER_TYPE = 64

#: Object store size of a local instance, bytes: tiny models and traces need little.
LOCAL_OBJECT_STORE_BYTES = 200 * 1024**2


def accelerator_resource(gpu: str) -> str:
    """The Ray custom resource that pins a worker to GPU type ``gpu`` (e.g. ``accelerator_type:A100``)."""
    return f"accelerator_type:{gpu}"


def ensure_ray(resources: Mapping[str, float] | None = None, num_cpus: int | None = None,
               address: str | None = None, emulate: bool = True):
    """Start a local Ray instance (or join ``address``) unless one is running; return ``ray``.

    ``resources``: custom resources of the local instance, e.g. ``{"accelerator_type:A100": 2}``.
    With ``emulate`` (CPU runs) a local instance also gets ``EMULATED_PER_TYPE`` units of every
    built-in GPU type, so later
    plans in the same process (tests share one instance) find their types. A running instance is
    reused as it is; if it lacks a resource a plan needs, placement fails with an error that
    names the resource.
    """
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return ray
    if address:
        ray.init(address=address, log_to_driver=False)
        return ray
    from hetrl.spec.hardware import gpu_catalog

    emulated = ({accelerator_resource(name): float(EMULATED_PER_TYPE) for name in gpu_catalog()}
                if emulate else {})
    emulated.update(resources or {})
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=num_cpus or os.cpu_count() or 1, resources=emulated,
             object_store_memory=LOCAL_OBJECT_STORE_BYTES, _temp_dir=f"/tmp/ray-{os.getuid()}",
             include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1",
                                       "TOKENIZERS_PARALLELISM": "false"}})
    return ray
