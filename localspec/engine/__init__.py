"""The target engine: llama.cpp model and context handles, text, and the cost curve."""

from localspec.engine.context import Context
from localspec.engine.model import Model

__all__ = ["Context", "Model"]
