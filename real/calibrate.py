"""Moved to :mod:`hetrl.calibrate` (it needs neither torch nor Ray); this name stays importable
for scripts written against it."""

from hetrl.calibrate import *  # noqa: F403
from hetrl.calibrate import __all__  # noqa: F401
