"""The GPU path's checks on a lent GPU: ``python experiments/gpu_check.py --out DIR``.

The same as ``python -m real.gpu_check`` (see that module and docs/real.md, "On a lent GPU"):
vLLM generation and weight update, a Megatron tp 2 step, a timed real-size PPO iteration
against the cost model, within ``--budget-s`` (default 420 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from real.gpu_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
