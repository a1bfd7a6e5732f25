"""sim: the discrete-event simulator of hetrl (SimPy). See :func:`simulate`."""

from sim.driver import SimResult, simulate

__all__ = ["SimResult", "simulate"]
