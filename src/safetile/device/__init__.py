"""Device operations: lazy ``DeviceOp`` values run synchronously, under asyncio or as graphs."""
from .kernel_op import KernelOp  # noqa: F401
from .op import DeviceOp, RunContext  # noqa: F401
