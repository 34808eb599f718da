"""Generated modules on disk, their Triton JIT functions and compiled binaries.

Generated source is written to a real file (``$SAFETILE_CACHE_DIR`` or
``~/.cache/safetile/generated``) so that ``inspect`` and Triton find it, and so a user can open
it. Compilation is lazy: the Triton module is imported on first launch or ``compile_for``.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from pathlib import Path

from ...errors import ArgumentError
from . import pack
from .emit import generate
from .spec import VariantKey

TRITON_TYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int32": "i32",
               "int64": "i64", "int8": "i8", "bool_": "i1"}

_import_lock = threading.Lock()
_compile_lock = threading.Lock()


def cache_dir() -> Path:
    d = Path(os.environ.get("SAFETILE_CACHE_DIR") or Path.home() / ".cache" / "safetile" / "generated")
    d.mkdir(parents=True, exist_ok=True)
    return d


class Variant:
    """One specialization of a kernel: generated source, and (lazily) its Triton function."""

    def __init__(self, kernel, key: VariantKey, program):
        self.kernel, self.key = kernel, key
        self.generated = generate(kernel, key, program)
        self.packing = pack.plan(self.generated.layout, list(kernel.params))
        self.binaries: dict = {}       # specialization key -> loaded CompiledKernel
        digest = hashlib.sha1(self.generated.source.encode()).hexdigest()[:16]
        self.path = cache_dir() / f"{self.generated.entry}_{digest}.py"
        self.module_name = f"safetile_generated.{self.generated.entry}_{digest}"
        if not self.path.exists():
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(self.generated.source)
            os.replace(tmp, self.path)
        self._jit = None

    @property
    def jit(self):
        """The ``@triton.jit`` function of the generated module (imported on first use)."""
        if self._jit is None:
            with _import_lock:
                if self._jit is None:
                    spec = importlib.util.spec_from_file_location(self.module_name, self.path)
                    module = importlib.util.module_from_spec(spec)
                    sys.modules[self.module_name] = module
                    spec.loader.exec_module(module)
                    self._jit = getattr(module, self.generated.entry)
        return self._jit

    def binary(self, spec: tuple, args: list, grid: tuple):
        """The loaded binary for the specialization key ``spec`` (compiled or fetched by
        ``JITFunction.warmup`` once per key, no launch)."""
        compiled = self.binaries.get(spec)
        if compiled is None:
            with _compile_lock:
                compiled = self.binaries.get(spec)
                if compiled is None:
                    compiled = self.binaries[spec] = self._load(args, grid)
        return compiled

    def _load(self, args: list, grid: tuple):
        """Triton's ``CompiledKernel`` for these arguments, loaded: the one place a binary is
        made (``benchmarks/bench_launch.py --cpu`` stands a fake in for it)."""
        compiled = self.jit.warmup(*args, grid=grid, **self.options())
        compiled._init_handles()
        return compiled

    def options(self) -> dict:
        o = {}
        if self.key.num_warps is not None:
            o["num_warps"] = self.key.num_warps
        if self.key.num_stages is not None:
            o["num_stages"] = self.key.num_stages
        if self.key.pdl:
            o["launch_pdl"] = True
        return o

    def compile_for(self, bound, target=None):
        """Compile without a GPU (default target: sm_90) and return Triton's CompiledKernel."""
        import triton
        from triton.backends.compiler import GPUTarget
        if target is None:
            target = GPUTarget("cuda", 90, 32)
        elif not isinstance(target, GPUTarget):
            raise ArgumentError(f"compile: target must be a triton GPUTarget (e.g. GPUTarget("
                                f"'cuda', 90, 32), the default), got {target!r}")
        args, _ = pack.pack(self.packing, bound)
        names = self.jit.arg_names
        signature, constexprs, attrs = {}, {}, {}
        params = self.jit.params
        for i, (name, a) in enumerate(zip(names, args)):
            if params[i].is_constexpr:
                signature[name] = "constexpr"
                constexprs[name] = a
            elif hasattr(a, "data_ptr") and hasattr(a, "dtype"):
                from ...dtypes import from_torch
                signature[name] = "*" + TRITON_TYPE[from_torch(a.dtype).name]
                if a.data_ptr() % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
            elif type(a).__name__ == "TensorDescriptor":
                from triton.runtime.jit import mangle_type
                signature[name] = mangle_type(a)
            elif isinstance(a, bool):
                signature[name] = "u1"
            elif isinstance(a, int):
                if a == 1:                         # as Triton's JIT does: 1 is specialized
                    signature[name] = "constexpr"
                    constexprs[name] = 1
                    continue
                signature[name] = "i32" if -2**31 <= a < 2**31 else "i64"
                if a % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
            elif isinstance(a, float):
                signature[name] = "fp32"
            else:
                raise TypeError(f"cannot derive a signature for argument {name}={a!r}")
        src = triton.compiler.ASTSource(self.jit, signature, constexprs, attrs)
        return triton.compile(src, target=target, options=self.options())
