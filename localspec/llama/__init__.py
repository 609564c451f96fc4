"""llama.cpp: model and context handles, text (tokens, chat templates), and the cost curve."""

from localspec.llama.context import Context
from localspec.llama.model import Model

__all__ = ["Context", "Model"]
