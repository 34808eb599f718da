"""A worker process that runs generated Triton sources under Triton's interpreter.

Triton's interpreter needs ``TRITON_INTERPRET=1`` when Triton itself is imported (its own
library functions, such as ``tl.cdiv``, must be interpreted too), so it runs in a process of
its own, started with the variable set (``Worker``; requests and replies are pickles on its
standard input and output). Two of its functions
are put right to compute what the GPU does: IEEE maxNum/minNum for ``tl.maximum``'s default
(it uses numpy's NaN-propagating maximum), and float arguments as fp32 runtime scalars (it
passes them on as Python floats, which then promote as compile-time numbers).
"""
import importlib.util
import os
import pickle
import struct
import sys

_FNS: dict = {}


def init() -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as I
    B = I.InterpreterBuilder
    B.create_maxnumf = lambda self, a, b: self.binary_op(a, b, np.fmax)
    B.create_minnumf = lambda self, a, b: self.binary_op(a, b, np.fmin)

    def flushed(x):
        """A subnormal fp32 argument as a zero of its sign, as the GPU's sqrt.approx.ftz and
        rsqrt.approx.ftz take it (lang/semantics.py)."""
        return np.where(np.abs(x) < np.float32(2.0**-126), x * np.float32(0.0), x)
    B.create_sqrt = lambda self, arg: I.TensorHandle(np.sqrt(flushed(arg.data)),
                                                     arg.dtype.scalar)
    B.create_rsqrt = lambda self, arg: I.TensorHandle(1 / np.sqrt(flushed(arg.data)),
                                                      arg.dtype.scalar)
    convert = I._implicit_cvt

    def implicit_cvt(arg):
        if type(arg) is float:
            return tl.tensor(I.TensorHandle(np.array([arg], dtype=np.float32), tl.float32),
                             tl.float32)
        return convert(arg)
    I._implicit_cvt = implicit_cvt


def run(path: str, entry: str, args: list, grid: tuple, outs: list) -> list:
    """Launch ``entry`` of the module at ``path``; returns the arguments at ``outs``."""
    import numpy as np
    fn = _FNS.get(path)
    if fn is None:
        spec = importlib.util.spec_from_file_location(f"interp_{len(_FNS)}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = _FNS[path] = getattr(module, entry)
    with np.errstate(all="ignore"):
        fn[grid](*args)
    return [args[i] for i in outs]


def serve() -> None:
    """Answer ``run`` requests from standard input until it closes."""
    init()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr                 # stray prints must not corrupt the replies
    while True:
        head = stdin.read(8)
        if len(head) < 8:
            return
        request = pickle.loads(stdin.read(struct.unpack("<Q", head)[0]))
        try:
            reply = ("ok", run(*request))
        except BaseException as e:          # reported to the caller
            reply = ("error", f"{type(e).__name__}: {e}")
        data = pickle.dumps(reply)
        stdout.write(struct.pack("<Q", len(data)) + data)
        stdout.flush()


class Worker:
    """A running ``serve`` process."""

    def __init__(self):
        import subprocess
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, TRITON_INTERPRET="1",
                   PYTHONPATH=os.pathsep.join([here] + sys.path))
        self.proc = subprocess.Popen([sys.executable, "-c", "import interp_worker; "
                                      "interp_worker.serve()"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)

    def run(self, *request):
        data = pickle.dumps(request)
        self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
        self.proc.stdin.flush()
        head = self.proc.stdout.read(8)
        if len(head) < 8:
            raise RuntimeError("the interpreter's worker process died")
        status, value = pickle.loads(self.proc.stdout.read(struct.unpack("<Q", head)[0]))
        if status != "ok":
            raise RuntimeError(f"Triton's interpreter failed: {value}")
        return value
