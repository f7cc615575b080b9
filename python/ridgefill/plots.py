"""matplotlib, headless; an optional dependency (`pip install .[plot]`)."""
from __future__ import annotations

from .errors import RidgefillError


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise RidgefillError("--plot needs matplotlib (pip install matplotlib, or RidgeFill's [plot] extra)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
