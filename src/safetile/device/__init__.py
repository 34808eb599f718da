"""Device operations: lazy ``DeviceOp`` values run synchronously, under asyncio or as graphs."""
from .combinators import MapOp, SharedOp, ThenOp, ZipOp, zip  # noqa: F401,A004
from .graph import Graph, GraphLaunchOp, graph_scope  # noqa: F401
from .scope import GraphScope  # noqa: F401
from .execution import RunContext  # noqa: F401
from .op import DeviceOp  # noqa: F401
from .aio import recovered, submit  # noqa: F401
from .collective import CollectiveOp, all_gather, all_reduce  # noqa: F401
