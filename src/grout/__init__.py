"""grout: a batch-1 Qwen3 inference engine whose every model op is a safe safetile kernel.

    import grout
    eng = grout.load("qwen3-4b")                 # or a checkpoint directory, or "tiny"
    print(eng.generate("Hello", max_new_tokens=32).text)
    for piece in eng.stream("Hello"):
        print(piece.text, end="")
"""
from .config import SHAPES, Qwen3Config  # noqa: F401
from .engine import Engine, load  # noqa: F401
from .errors import CheckpointError, GroutError, RequestError  # noqa: F401
from .outputs import Completion, Piece, Stream  # noqa: F401
from .sampler import SamplingParams  # noqa: F401
from .tokenizer import Tokenizer  # noqa: F401

import safetile as _safetile  # noqa: E402

__version__ = _safetile.__version__               # one distribution, one version

__all__ = ["load", "Engine", "Completion", "Piece", "Stream", "Qwen3Config", "SHAPES",
           "SamplingParams", "Tokenizer", "GroutError", "CheckpointError", "RequestError"]
