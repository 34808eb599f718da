"""grout's typed errors: every failure a user can cause is one of these (all ValueErrors)."""


class GroutError(ValueError):
    """Base class of grout's errors."""


class CheckpointError(GroutError):
    """A checkpoint cannot be used: a missing file, a truncated or corrupt safetensors file,
    a tensor missing or of the wrong shape, an unsupported architecture. The message names
    the file (and the tensor)."""


class RequestError(GroutError):
    """A request cannot be served as given: a prompt longer than the cache, token ids outside
    the vocabulary, bad sampling parameters, an unknown model name or device."""


class ShardingError(GroutError):
    """A model cannot be split over the requested number of ranks (tensor parallelism): a
    head count, the MLP width or the vocabulary that the rank count does not divide."""
