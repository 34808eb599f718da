"""Typed errors of safetile: each says what was wrong, where, and what to do."""


class SafetileError(Exception):
    """Base class of every error safetile raises."""


class KernelDefinitionError(SafetileError):
    """A kernel or function definition breaks a rule; raised when the decorator runs.

    The message starts with ``file:line`` of the offending code and names the rule.
    """

    def __init__(self, message: str, filename: str = "<unknown>", lineno: int = 0,
                 rule: str = ""):
        self.filename, self.lineno, self.rule = filename, lineno, rule
        where = f"{filename}:{lineno}: " if lineno else f"{filename}: "
        tag = f"[{rule}] " if rule else ""
        super().__init__(f"{where}{tag}{message}")


class LaunchError(SafetileError):
    """Arguments given to a kernel launch do not match its parameters."""


class MovedError(SafetileError):
    """A handle was used after it was moved into a partition, a share or an operation."""


class BorrowError(SafetileError):
    """A Shared value cannot be unwrapped or partitioned while other holders exist."""


class HeldInFlightError(MovedError, BorrowError):
    """``try_unwrap()`` / ``try_partition()`` of a Shared handle that is itself moved into an
    operation not yet synchronized. That operation still holds the value (a ``BorrowError``,
    as for any in-flight holder) and the handle is moved (a ``MovedError``): either
    ``except`` clause catches it."""


class AliasError(SafetileError):
    """A mutable output overlaps another argument of the same launch or an in-flight hold."""


class UnsafeError(SafetileError):
    """An ``unsafe=True`` kernel launched outside ``with st.unsafe():``; st.unsafe misused."""


class RaceError(SafetileError):
    """The CPU executor saw two programs write one element, or read another's write."""


class OutOfBoundsError(SafetileError):
    """The CPU executor saw an access outside a tensor or outside an owned slab."""


class DivisionByZeroError(SafetileError, ZeroDivisionError):
    """The CPU executor saw an integer division or remainder by zero (on the GPU, where it
    cannot be reported, ``x // 0`` is 0 and ``x % 0`` is ``x``)."""


class CopyError(SafetileError, TypeError):
    """A handle (Tensor, Shared, Partition) or an operation was copied or pickled.

    A copy would be a second owner that the ownership rules do not count: make another
    read handle with ``Shared.clone()``, or build the operation again."""


class FrozenError(SafetileError, AttributeError):
    """An attribute that the safety checks rely on (a kernel's ``unsafe`` flag, its checked
    body) was assigned after the kernel was defined."""


class NotRunError(SafetileError, TypeError):
    """A lazy ``DeviceOp`` was used as its values (unpacked, indexed, iterated) before it ran:
    a launch only builds the op; ``op.sync()`` or ``await op`` runs it and returns the
    values. Also a ``TypeError``, which Python raises for a value that cannot be unpacked."""


class GraphCaptureError(SafetileError):
    """An operation that allocates (or cannot be captured) was recorded into a graph."""


class ExecutionError(SafetileError):
    """Execution was started where it is not allowed (e.g. inside a running ``then``), or
    memory was borrowed or checked inside a finalizer that a garbage collection ran in the
    middle of another borrow check on the same thread."""


class PartitionError(SafetileError, ValueError):
    """A tile shape or partition option is invalid for the tensor it partitions."""


class IndexOutOfRangeError(SafetileError, IndexError):
    """A host-side index is outside the value it indexes: a dimension of ``t.slice``, an
    element index of ``t[...]``, a tile of ``Partition.tile_slices`` or a position of a
    program order. Also an ``IndexError``, so iterating a Tensor stops at its end."""


class CollectiveError(SafetileError):
    """A collective (``st.all_reduce``, ``st.all_gather``) could not run or failed: no
    process group, a buffer on the wrong device for its backend, or a peer that left or
    timed out. The buffers are handed back (``error.recovered``)."""


class ArgumentError(SafetileError, TypeError, ValueError):
    """A library op or host function was given an argument of the wrong kind, shape or value.

    It is also a ``TypeError`` and a ``ValueError``, so code written against Python's own
    exceptions keeps working.
    """


class UnrunOpWarning(RuntimeWarning):
    """An operation was built and then dropped without being run: nothing was computed.

    Shown by default (like asyncio's "coroutine was never awaited"); the warning points at
    the line that built the op.
    """


class BlockingSyncWarning(RuntimeWarning):
    """``op.sync()`` was called on a thread that runs an asyncio event loop, which it blocks
    until the work is done; ``await op`` waits without blocking the loop."""
