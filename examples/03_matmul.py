"""Matrix product: each program owns a (BM, BN) tile of C and walks K in BK steps.

The grouped program order makes neighbouring programs share rows of A in L2.
"""
import sys

import torch

import safetile as st
import safetile.lang as sl


@st.kernel
def matmul(a: st.In[st.floats, 2], b: st.In[st.floats, 2], c: st.Out[st.floats, 2],
           BK: st.Const[int]):
    i, j = c.index
    acc = sl.zeros(c.shape, st.f32)
    for k in range(sl.cdiv(a.shape[1], BK)):
        acc = sl.mma(a.load((i, k), (c.shape[0], BK)), b.load((k, j), (BK, c.shape[1])), acc)
    c.store(acc)


def run(m: int, n: int, k: int, dtype, tile=(64, 64), bk=32) -> bool:
    a = st.randn((m, k), dtype=dtype, seed=m)
    b = st.randn((k, n), dtype=dtype, seed=n)
    expected = a.to_torch().double() @ b.to_torch().double()
    c = st.empty((m, n), dtype=st.f32).partition(tile, order="grouped", group_size=4)
    a, b, c, _ = matmul(a, b, c, bk).sync()
    result = c.unpartition().to_torch().double()
    err = ((result - expected).norm() / expected.norm()).item()
    ok = err < (1e-5 if dtype is st.f32 and result.device.type == "cpu" else 1e-2)
    print(f"03_matmul: ({m}x{k}) @ ({k}x{n}) {dtype.name}: rel err {err:.2e}: "
          f"{'matches torch' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    results = [run(200, 136, 100, st.f32), run(256, 192, 160, st.bf16), run(64, 64, 64, st.f16)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
