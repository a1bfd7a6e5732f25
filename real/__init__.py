"""real: execute plans for real on Ray and calibrate the cost model from the traces.

One Ray actor per planned device (``real.worker``, given a ``real.worker_spec.WorkerSpec``),
pinned to its GPU type by a placement group (``real.placement``) and owned by one
``real.worker_group.WorkerGroup``; the RL loop is driven by ``real.runner`` (PPO and GRPO, sync
and async; its configuration in ``real.config``, its training step's dispatchers in
``real.training``, its checkpoint file in ``real.checkpoint``);
``real.network`` emulates the cluster's latency and bandwidth on one machine; ``real.engines``
holds the torch engines (CPU or CUDA) behind small interfaces; ``real.profile`` and
``hetrl.calibrate`` close the loop with the cost model. Heavy imports (torch, transformers, Ray)
happen inside these modules, never on ``import real``. See docs/real.md.
"""
