"""What the megatron engine needs around megatron-core: the shims that let its CUDA-minded code
run on CPU tensors, a p2p communicator that reports each pipeline receive and a timer of the
schedule's backward steps (for the real backend's network and speed emulation), and a
torch.distributed world of one for an engine used alone.
megatron-core is imported inside the functions only."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hetrl.errors import require
from real.engines.megatron_parallel import MegatronGrid, create_groups
from real.ray_env import free_port

#: Called with (stage index of the sender, bytes) after each pipeline p2p receive; the real
#: backend's network emulation waits there.
OnReceive = Callable[[int, float], None]
#: torch factories megatron-core calls with ``device="cuda"`` literally (see :func:`cpu_shims`).
CUDA_FACTORIES = ("zeros", "ones", "empty", "full", "tensor", "arange")


@contextlib.contextmanager
def cpu_shims() -> Iterator[None]:
    """Let megatron-core's forward, backward, schedule and optimizer run on CPU tensors, all
    restored on exit (process-global while active; for the CPU test mode only):

    * ``torch.cuda.current_device()`` returns ``"cpu"`` and ``torch.cuda.synchronize()`` does
      nothing;
    * ``torch.zeros``, ``torch.tensor`` and the other factories of ``CUDA_FACTORIES`` given
      ``device="cuda"`` (the schedules' token counter, the optimizer's overflow flag) make CPU
      tensors;
    * ``Tensor.type()`` of a CPU float tensor reads ``torch.cuda.FloatTensor`` (the optimizer
      and gradient clipping accept only CUDA type names);
    * the CUDA RNG tracker's ``fork()`` does nothing (no dropout is configured);
    * Megatron's global scratch buffer is a fresh one (unset without ``parallel_state``'s
      initialisation; a CUDA engine built earlier in the process leaves CUDA tensors in it,
      which the attention would reuse);
    * CUDA streams are one CPU stand-in (:class:`_CpuStream`, the current stream and every new
      one, events synchronising at once): the MoE all-to-all token dispatcher copies its split
      sizes to the host on a side stream, which on CPU is the current one;
    * that copy's ``as_numpy`` holds for CPU tensors too (megatron-core converts only CUDA
      ones, and gloo's all-to-all takes its split sizes as a sequence, not a tensor).
    """
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.transformer.moe import token_dispatcher
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
    from megatron.core.utils import GlobalMemoryBuffer

    tracker = tensor_parallel.get_cuda_rng_tracker()
    factories = {name: getattr(torch, name) for name in CUDA_FACTORIES}
    saved = (torch.cuda.current_device, torch.cuda.synchronize, torch.Tensor.type, tracker.fork,
             parallel_state._GLOBAL_MEMORY_BUFFER, torch.cuda.Stream, torch.cuda.current_stream,
             torch.cuda.stream, token_dispatcher.maybe_move_tensor_to_cpu)
    dispatcher = MoEAlltoAllTokenDispatcher
    to_host = token_dispatcher.maybe_move_tensor_to_cpu

    def to_host_cpu(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return to_host(tensor, as_numpy=as_numpy, record_stream=record_stream)

    type_of = torch.Tensor.type

    def on_cpu(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def make(*args: Any, **kwargs: Any) -> torch.Tensor:
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return factory(*args, **kwargs)
        return make

    def cuda_type(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        name = type_of(self, *args, **kwargs)
        if not args and not kwargs and isinstance(name, str) and self.device.type == "cpu":
            return name.replace("torch.", "torch.cuda.", 1)
        return name

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    for name, factory in factories.items():
        setattr(torch, name, on_cpu(factory))
    torch.Tensor.type = cuda_type
    tracker.fork = lambda *args, **kwargs: contextlib.nullcontext()
    parallel_state._GLOBAL_MEMORY_BUFFER = GlobalMemoryBuffer()
    torch.cuda.Stream = lambda *args, **kwargs: CPU_STREAM
    torch.cuda.current_stream = lambda *args, **kwargs: CPU_STREAM
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()
    token_dispatcher.maybe_move_tensor_to_cpu = to_host_cpu
    if dispatcher.cuda_dtoh_stream is None:
        dispatcher.cuda_dtoh_stream = CPU_STREAM
    try:
        yield
    finally:
        (torch.cuda.current_device, torch.cuda.synchronize, torch.Tensor.type, tracker.fork,
         parallel_state._GLOBAL_MEMORY_BUFFER, torch.cuda.Stream, torch.cuda.current_stream,
         torch.cuda.stream, token_dispatcher.maybe_move_tensor_to_cpu) = saved
        for name, factory in factories.items():
            setattr(torch, name, factory)
        if dispatcher.cuda_dtoh_stream is CPU_STREAM:  # a CUDA dispatcher makes its own later
            dispatcher.cuda_dtoh_stream = None


@contextlib.contextmanager
def counting_alltoalls(counts: list[int]) -> Iterator[None]:
    """Within the block, each all-to-all of megatron-core's MoE token dispatcher adds to
    ``counts`` [bytes sent to the group's other ranks, calls]: its forward ones (the tokens'
    hidden states and their routing probabilities, dispatched and combined); the backward's
    move the same bytes back the other way."""
    from megatron.core.transformer.moe import token_dispatcher

    a2a = token_dispatcher.all_to_all

    def counted(group: Any, input_: torch.Tensor, output_split_sizes: Any = None,
                input_split_sizes: Any = None) -> torch.Tensor:
        size, rows = group.size(), input_.shape[0]
        if size > 1 and rows:
            own = (rows // size if input_split_sizes is None
                   else int(input_split_sizes[group.rank()]))
            counts[0] += (rows - own) * (input_.numel() // rows) * input_.element_size()
            counts[1] += 1
        return a2a(group, input_, output_split_sizes, input_split_sizes)

    token_dispatcher.all_to_all = counted
    try:
        yield
    finally:
        token_dispatcher.all_to_all = a2a


class _CpuStream:
    """A CUDA stream's stand-in on CPU: work is done when issued, so waits do nothing."""

    def wait_stream(self, other: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return self

    def synchronize(self) -> None:
        pass


CPU_STREAM = _CpuStream()


def one_process_world(device: torch.device, grid: MegatronGrid) -> dict[str, Any]:
    """A torch.distributed world of one process (NCCL on CUDA, gloo on CPU), unless one exists,
    and the groups of ``grid`` (one device, rank 0) in it (for an engine used alone, as in
    tests)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1)
    require(dist.get_world_size() == 1, "torch.distributed world size", dist.get_world_size(),
            "must be 1 for a megatron engine built without a grid; pass grid and groups to "
            "train in a larger world")
    return create_groups(grid.groups(), 0)


def reporting_p2p(pp_group: Any, config: Any, on_receive: OnReceive | None) -> Any:
    """Megatron's ``P2PCommunicator`` over ``pp_group``, calling ``on_receive(stage, bytes)``
    after each receive from the previous or next stage (stage = the sender's rank in the group)."""
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    class Reporting(P2PCommunicator):
        def _communicate(self, **kwargs: Any) -> Any:
            prev, nxt, reqs = super()._communicate(**kwargs)
            rank, size = pp_group.rank(), pp_group.size()
            if on_receive is not None:
                for tensor, peer in ((prev, rank - 1), (nxt, rank + 1)):
                    if tensor is not None and 0 <= peer < size:
                        on_receive(peer, float(tensor.numel() * tensor.element_size()))
            return prev, nxt, reqs

    return Reporting(pp_group, config)


@contextlib.contextmanager
def timed_backward(seconds: list[float]) -> Iterator[None]:
    """Within the block, megatron-core's pipeline schedules time each micro-batch's backward
    (``schedules.backward_step``) into ``seconds`` (appended). The backward is autograd's, run
    inside the schedule; this is the only place its compute can be told from its waits."""
    from megatron.core.pipeline_parallel import schedules

    backward_step = schedules.backward_step

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = backward_step(*args, **kwargs)
        seconds.append(time.perf_counter() - start)
        return out

    schedules.backward_step = timed
    try:
        yield
    finally:
        schedules.backward_step = backward_step
