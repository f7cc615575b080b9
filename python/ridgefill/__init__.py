"""RidgeFill: training-free approximate prefill for llama.cpp."""
from ._version import __version__

__all__ = ["__version__"]
