"""localspec: lossless speculative decoding for quantized GGUF models over llama.cpp."""

# llama_cpp first: it loads libllama/libggml from llama_cpp/lib, so that _native, which links
# against those same files, binds to the copies already in the process instead of a second one.
import llama_cpp  # noqa: F401

from localspec import _native  # noqa: E402,F401

__version__ = "0.1.0"
