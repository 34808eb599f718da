"""``@st.kernel`` and ``@st.function``: definitions checked at import time."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, overload

from ..device.op import DeviceOp
from ..device.unrun import building_site
from ..errors import ArgumentError, FrozenError, KernelDefinitionError, LaunchError
from .cache import LaunchCache
from .checker import check_function, check_kernel
from .launch import compile_for_target, launch, variant_for
from .params import parse_annotation
from .source import KernelSource
from .static_shapes import check_static_shapes

LAUNCH_OPTIONS = {"num_warps", "num_stages", "grid", "tma", "flatten", "warp_specialize",
                  "loop_stages", "tma_store", "pdl", "early", "trigger_early"}
_FLAGS = ("tma", "flatten", "warp_specialize", "tma_store", "pdl", "trigger_early")


def _as_int(v):
    """``v`` as a plain int if it is an int (an int subclass is read through ``int.__int__``,
    not its own comparisons, which could lie), else None. Bools are not ints here."""
    t = type(v)
    if t is int:
        return v
    return int.__int__(v) if t is not bool and issubclass(t, int) else None


def _as_str(v):
    """``v`` as a plain str if it is a str (a subclass is copied: its ``==``, ``hash`` and
    ``in`` could lie to the checks that read it), else None."""
    return str.__str__(v) if issubclass(type(v), str) else None


def normalized_options(name: str, params: dict, opts) -> dict:
    """A plain, checked copy of the launch options ``opts``, or ``ArgumentError``.

    Every option is known; warps are a power of two up to 32, pipeline depths positive ints
    (``None`` leaves a numeric option at its default), flags bools; ``early`` names In
    parameters. The copy holds plain ints, strs and tuples only, so the variant that codegen
    keys on these options and the launcher's checks of them read the same values, whatever
    subclass the caller passed. ``grid`` is checked where it is used (launch.py)."""
    out = {}
    for key, v in dict(opts).items():
        k = _as_str(key)
        if k not in LAUNCH_OPTIONS:
            raise ArgumentError(f"kernel '{name}': unknown launch option {key!r}; known: "
                                f"{sorted(LAUNCH_OPTIONS)}")
        if k == "num_warps" and v is not None:
            n = _as_int(v)
            if n not in (1, 2, 4, 8, 16, 32):
                raise ArgumentError(f"kernel '{name}': num_warps must be 1, 2, 4, 8, 16 or 32, "
                                    f"got {v!r}")
            v = n
        elif k in ("num_stages", "loop_stages") and v is not None:
            n = _as_int(v)
            if n is None or not 1 <= n <= 64:       # pipeline depths; Triton takes an int32
                raise ArgumentError(f"kernel '{name}': {k} must be an int in [1, 64], got {v!r}")
            v = n
        elif k in _FLAGS and type(v) is not bool:
            raise ArgumentError(f"kernel '{name}': {k} must be True or False, got {v!r}")
        elif k == "early":
            v = _early(name, params, v)
        elif k == "grid":
            v = _grid(v)
        out[k] = v
    return out


def _early(name: str, params: dict, early) -> tuple:
    """``early`` as a new tuple of plain strs, each an In parameter's name."""
    names = None
    if early is not None and _as_str(early) is None:
        try:
            names = tuple(_as_str(n) for n in early)
        except TypeError:                         # not iterable
            names = None
    if names is None or not all(n is not None and n in params and params[n].kind == "In"
                                for n in names):
        raise ArgumentError(f"kernel '{name}': early={early!r} must be a tuple of In "
                            f"parameter names (In parameters: "
                            f"{[n for n, p in params.items() if p.kind == 'In']})")
    return names


def _grid(grid):
    """``grid`` with its ints plain and a sequence made a tuple (what launch.py checks)."""
    n = _as_int(grid)
    if n is not None:
        return n
    if not isinstance(grid, (tuple, list)):      # a set, dict or generator has no axis order:
        return grid                               # refused at launch
    return tuple(x if _as_int(x) is None else _as_int(x) for x in grid)


def _plain(fn, what: str):
    """Refuse what is not a plain ``def``: a wrapper (``functools.wraps``) would let the checker
    read one body while another runs."""
    if not inspect.isfunction(fn) or hasattr(fn, "__wrapped__"):
        # a kernel or helper decorated again names the function it wraps
        code = getattr(fn, "__code__", None) or getattr(getattr(fn, "fn", None), "__code__", None)
        raise KernelDefinitionError(
            f"{what} decorates a plain `def` function (no wrapper, no functools.wraps, no "
            f"callable object), got {fn!r}", getattr(code, "co_filename", "<unknown>"),
            getattr(code, "co_firstlineno", 0), "source")


class _Frozen:
    """Attributes that the safety checks rely on are set once, when the decorator runs."""

    _FROZEN: frozenset = frozenset()

    def __setattr__(self, name, value):
        if name in self._FROZEN and name in self.__dict__:
            raise FrozenError(f"{self!r}: '{name}' is fixed where the kernel is defined; "
                              f"define another kernel (or use .options(...) for launch "
                              f"options)")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        if name in self._FROZEN:
            raise FrozenError(f"{self!r}: '{name}' is fixed where the kernel is defined")
        object.__delattr__(self, name)


class Function(_Frozen):
    """An ``@st.function`` helper callable from kernel bodies (and from the CPU executor)."""

    __safetile_function__ = True
    _FROZEN = frozenset({"fn", "name", "_src", "_info"})

    def __init__(self, fn):
        _plain(fn, "@st.function")
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._src = KernelSource(fn)
        self._info = check_function(self._src)
        check_static_shapes(self._src, {}, self._info)
        self._bodies: dict = {}        # backend name -> its executable form of the body

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def function(fn) -> Function:
    """Declare a helper that kernels may call: the same body rules, tiles and scalars only."""
    return Function(fn)


class Kernel(_Frozen):
    """A checked tile kernel (what ``@st.kernel`` makes; see ``help(st.kernel)``).

    ``kernel(*args)`` returns a lazy ``DeviceOp`` whose output is every argument, in
    parameter order (an Out as its ``Partition``); ``kernel.options(...)`` a configured copy;
    ``kernel.source(*args)`` the generated Triton source; ``kernel.compile(*args)`` a
    compiled binary for sm_90, also without a GPU. What the safety checks rely on (the
    function, its checked body, ``unsafe``, the options) is fixed once defined: ``opts`` is a
    read-only mapping of plain values, checked when the decorator or ``options()`` ran.
    """

    _FROZEN = frozenset({"fn", "name", "unsafe", "_src", "params", "_info", "opts"})
    _st_sync_call = True      # a call builds an op, never a coroutine (op.then(kernel))

    def __init__(self, fn, unsafe: bool = False, options: dict | None = None):
        _plain(fn, "@st.kernel")
        if not isinstance(unsafe, bool):
            raise KernelDefinitionError(f"@st.kernel(unsafe=...) takes True or False, got "
                                        f"{unsafe!r}", getattr(fn.__code__, "co_filename", "?"),
                                        fn.__code__.co_firstlineno, "source")
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self.unsafe = unsafe
        self._src = KernelSource(fn)
        self.params = MappingProxyType(self._parse_params())   # read-only, as opts
        self._info = check_kernel(self._src, self.params, unsafe)
        check_static_shapes(self._src, self.params, self._info)
        # A read-only view of a private checked copy: the variant key (cache.py) and the
        # launcher (kernel_op.py) read these options at different times and must agree.
        self.opts = MappingProxyType(normalized_options(self.name, self.params, options or {}))
        self._launches = LaunchCache(self)   # every launch cache of this kernel (kernel/cache.py)
        self._bodies: dict = {}        # backend name -> its executable form of the body (shared
                                       # with the options() copies)

    @property
    def where(self) -> str:
        """``file:line`` of the kernel's definition (errors and messages name it)."""
        return f"{self._src.filename}:{self._src.first_line}"

    def _parse_params(self) -> dict:
        try:
            hints = inspect.get_annotations(self.fn, eval_str=True)
        except Exception as e:                      # an annotation that does not evaluate
            raise self._src.error(self._src.tree, "annotation",
                                 f"kernel annotations must evaluate: {e}") from None
        params = {}
        for arg in self._src.tree.args.args:
            if arg.arg not in hints:
                raise self._src.error(arg, "annotation",
                                     f"parameter '{arg.arg}' needs an annotation (st.In[dtype], "
                                     f"st.Out[dtype], st.Const[...], int or float)")
            try:
                params[arg.arg] = parse_annotation(hints[arg.arg])
            except TypeError as e:
                raise self._src.error(arg, "annotation", f"parameter '{arg.arg}': {e}") from None
        return params

    def options(self, **opts) -> "Kernel":
        """A copy of this kernel with launch options.

        ``num_warps``, ``num_stages``, ``grid``, ``tma`` (tensor-descriptor loads and stores
        where the layout allows), and two hints for the persistent ``for t in z.tiles():``
        loop (in a kernel without ``Out`` parameters: a hand-written ``for t in
        range(sl.bid(0), n, sl.num_blocks(0))``), which change scheduling but never the
        tile -> program map: ``flatten`` (fuse it
        with the inner loop so the next tile's loads overlap this tile's epilogue) and
        ``warp_specialize`` (Triton's producer/consumer warp groups); and ``loop_stages=n``,
        which software-pipelines every innermost ``for ... in range(...)`` loop ``n`` deep,
        all its loads included (``num_stages`` pipelines only loads that feed ``sl.mma``).
        ``tma_store=True`` writes an Out's owned tile through a tensor descriptor when the
        kernel stores it once and never reads it back (it costs a shared-memory staging
        buffer of one tile, hence opt-in).
        ``pdl=True`` launches with programmatic dependent launch (Hopper): the kernel may be
        scheduled while the previous kernel on the stream still runs, so its launch latency
        hides behind that kernel's tail. Every program first executes ``griddepcontrol.wait``
        (it returns once the previous grids have completed and their writes are visible)
        before any load or store (only index arithmetic and ``x.prefetch`` L2 hints of In
        views may precede it: they deliver no value), so ordering is exactly that of a plain
        launch; it then signals that the next PDL kernel may be scheduled.
        ``early=("w", ...)`` (with ``pdl``) names In parameters whose loads in the body's
        leading statements also run before the wait, overlapping the kernels before it (a
        gemv's weights, which no recent kernel writes). At each launch the launcher knows
        which launches of the same execution (or graph) may still run: the one just before,
        and those before it that an early signal lets through (``trigger_early``). If one of
        them may write bytes of an early parameter, if more than eight may run, or if what
        runs just before is unknown (the first launch of an execution or a graph, a launch
        after a ``then``/``map`` callback), this launch goes without programmatic launch,
        in plain stream order.
        ``trigger_early=True`` (with ``pdl``) lets the next PDL kernel be scheduled as soon
        as this kernel's programs start, rather than once they have passed their wait, so
        that its early loads overlap this kernel's whole run; its stores still wait for this
        kernel, and the check above covers the kernels it may then overlap.
        """
        return self._launches.copy({**self.opts, **opts}, self._configured, self._normalized)

    def _normalized(self, opts: dict) -> dict:
        return normalized_options(self.name, self.params, opts)

    def _configured(self, opts: dict) -> "Kernel":
        """A copy of this kernel with the options ``opts`` (``normalized_options``)."""
        k = object.__new__(Kernel)
        k.__dict__.update(self.__dict__)
        k.__dict__["opts"] = MappingProxyType(opts)
        k.__dict__["_launches"] = self._launches.for_options(k)
        return k

    def __call__(self, *args, **kwargs) -> DeviceOp:
        """Check the arguments and move them into a lazy op (see ``st.kernel``)."""
        op = launch(self, args, kwargs)
        op.site = building_site()        # named by the warning if the op is dropped unrun
        return op

    def __getitem__(self, grid):
        """Refuse Triton's ``kernel[grid](...)``, saying where a launch's grid comes from."""
        if any(spec.kind == "Out" for spec in self.params.values()):
            how = ("its grid is its Out partition, one program per tile "
                   "(st.empty(shape).partition(tile_shape))")
        else:
            how = f"with no Out, give the grid as {self.name}.options(grid=(n,))(...)"
        raise LaunchError(f"kernel '{self.name}' ({self.where}) is launched by calling it, "
                          f"{self.name}(...), not with Triton's {self.name}[grid](...): {how}")

    def source(self, *args, **kwargs) -> str:
        """The generated Triton source for these arguments (nothing is moved or run)."""
        return variant_for(self, args, kwargs).generated.source

    def compile(self, *args, target=None, **kwargs):
        """Compile for ``target`` (default: sm_90) without a GPU; returns Triton's CompiledKernel."""
        return compile_for_target(self, args, kwargs, target)

    def __repr__(self) -> str:
        return f"<st.kernel {self.name} at {self.where}{' unsafe' if self.unsafe else ''}>"


@overload
def kernel(fn: Callable[..., Any], *, unsafe: bool = False, **options: Any) -> Kernel: ...
@overload
def kernel(fn: None = None, *, unsafe: bool = False,
           **options: Any) -> Callable[[Callable[..., Any]], Kernel]: ...


def kernel(fn=None, *, unsafe=False, **options):
    """Define a tile kernel: ``@st.kernel`` or ``@st.kernel(unsafe=False, **launch_options)``.

    The body is checked when the decorator runs (at import): a broken rule raises
    ``KernelDefinitionError`` naming the file, the line and the rule. Each parameter is
    declared by its annotation:

    - ``st.In[dtype]`` or ``st.In[dtype, rank]``: a shared, read-only tensor; pass a
      ``Tensor`` or a ``Shared``. Body: ``x.shape[i]``, ``x.load(index, shape, padding=0)``,
      ``sl.load_like(x, z)`` (see ``help(st.In)``).
    - ``st.Out[dtype]`` or ``st.Out[dtype, rank]``: this program's owned tile; pass a
      ``Partition`` (``tensor.partition(tile_shape)``). Body: ``z.shape``, ``z.index``,
      ``z.load()``, ``z.store(tile)``, ``z.partition(sub_shape).store(tile, sub_index)`` (see
      ``help(st.Out)``). All Outs share one grid, and it is the launch grid.
    - ``st.Const[int | float | bool | st.dtype]``: a compile-time constant (a variant per value).
    - ``int``, ``float``: runtime scalars.
    - ``st.Ptr[dtype]``: a raw pointer, only with ``unsafe=True``; such a kernel is launched
      inside ``with st.unsafe():``.

    ``dtype`` may be a union (``st.f32 | st.bf16``, ``st.floats``): a variant per dtype. The
    body may use ``safetile.lang`` operations (``sl.*``), Python arithmetic, ``for ... in
    range(...)``, ``if`` on scalars (``sl.where`` for an element-wise choice) and
    ``@st.function`` helpers.

    Calling the kernel runs nothing: it checks the arguments, moves them into a lazy
    ``DeviceOp`` and returns it. Running the op (``op.sync()``, ``await op``, ``op.then(f)``, a
    graph) hands every argument back in parameter order, scalars included; an Out comes back
    as its ``Partition``, and ``.unpartition()`` gives the ``Tensor``::

        @st.kernel
        def scale(x: st.In[st.f32], z: st.Out[st.f32], k: float):
            z.store(sl.load_like(x, z) * k)

        x, z, k = scale(st.randn((4096,)), st.empty((4096,)).partition((1024,)), 2.0).sync()
        y = z.unpartition().to_torch()

    An op dropped without being run warns (``st.UnrunOpWarning``). ``unsafe=True`` allows raw
    pointers, free-index stores and atomics (unchecked on the GPU). Keyword options are launch
    options, as ``Kernel.options`` takes them.
    """
    if fn is None:
        return lambda f: Kernel(f, unsafe=unsafe, options=options)
    return Kernel(fn, unsafe=unsafe, options=options)


class Decorator:
    """A function that also reaches the modules of the package of the same name.

    ``safetile.kernel`` is the decorator and the package ``safetile/kernel/`` alike; the
    name holds this object, so that ``import safetile.kernel.params`` and
    ``safetile.kernel.launch`` reach the modules while ``@st.kernel`` decorates.
    """

    def __init__(self, fn, package: str):
        functools.update_wrapper(self, fn)     # __doc__, __name__, signature (__wrapped__)
        self._package = package

    def __call__(self, *args, **kwargs):
        return self.__wrapped__(*args, **kwargs)

    def __get__(self, obj, objtype=None):
        # A non-data descriptor, as functions are: inspect.isroutine() and help() then
        # document it as the function it stands for.
        return self

    def __getattr__(self, name: str):
        if not name.startswith("_"):
            module = f"{self._package}.{name}"
            if module in sys.modules or importlib.util.find_spec(module) is not None:
                return importlib.import_module(module)
        raise AttributeError(f"st.kernel has no attribute {name!r} (nor is {name!r} a module "
                             f"of {self._package})")

    def __repr__(self) -> str:
        return f"<st.kernel decorator; package {self._package}>"


if not TYPE_CHECKING:          # type checkers see the plain, overloaded function
    kernel = Decorator(kernel, __package__)

