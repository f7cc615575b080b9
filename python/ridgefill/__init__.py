"""RidgeFill: training-free approximate prefill for llama.cpp."""
from ._version import __version__

__all__ = ["__version__", "Llama"]


def __getattr__(name):
    if name == "Llama":  # imported lazily: it loads the native library
        from .runtime import Llama
        return Llama
    raise AttributeError(name)
