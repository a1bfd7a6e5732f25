"""The simulator's guards: it ends, with one line naming the cause, when time would leave the
range a float can resolve.

Simulated time is a float of seconds. At time t the smallest step that still moves the clock
is about t * 2.2e-16 (1.5e-8 s at 1e8 s), so a transfer or compute step shorter than that
would not advance it, and a loop waiting for it would spin forever. Two guards:

- :data:`HORIZON_S`: no simulation may pass 1e9 s (about 32 years; the clock still resolves
  0.12 microseconds there). A transfer whose end would lie beyond it, or a step that jumps the
  clock past it, raises :class:`SimulationLimitError` naming the link, device or fault.
- :data:`STUCK_EVENTS`: that many events in a row at one instant means no progress; the run
  stops with :class:`SimulationLimitError` rather than spin.

The network itself completes a flow whose remaining time is below the clock's resolution
(relative-time arithmetic, :func:`below_resolution`) instead of waiting for it.
"""

from __future__ import annotations

from hetrl.errors import HetrlError

#: Seconds of simulated time no run may pass.
HORIZON_S = 1e9
#: Events in a row at one simulated instant that count as no progress.
STUCK_EVENTS = 1_000_000


class SimulationLimitError(HetrlError):
    """A simulation cannot go on: simulated time would leave the range the simulator resolves
    (or stopped advancing). The message names the link, device or fault that caused it; the
    CLI prints it in one line and exits 2."""


def below_resolution(now: float, seconds: float) -> bool:
    """Whether ``seconds`` from ``now`` is too short to move a float clock at ``now``."""
    return now + seconds <= now


def check_horizon(now: float, seconds: float, what: str) -> None:
    """Raise unless ``now + seconds`` stays within :data:`HORIZON_S`; ``what`` says what
    would take ``seconds`` (a transfer over a named link, a step on a named device)."""
    if not now + seconds <= HORIZON_S:  # (also catches inf and nan)
        raise SimulationLimitError(
            f"{what} needs {seconds:.3g} s more at simulated time {now:.3g} s: past the "
            f"simulator's horizon of {HORIZON_S:.0e} s")
