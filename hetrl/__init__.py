"""hetrl: plan, estimate, search, simulate and run RL post-training of LLMs on heterogeneous GPUs.

Importing this package is cheap: it never imports torch, Ray or SimPy.
"""

__version__ = "0.1.0"

from hetrl.errors import HetrlError, SpecError  # noqa: E402

__all__ = ["HetrlError", "SpecError", "__version__"]
