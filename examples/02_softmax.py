"""Row softmax: each program owns a (ROWS, BLOCK) tile covering whole rows.

Columns past the end read as -inf, so they contribute exp(-inf) = 0 to the row sum.
"""
import sys

import torch

import safetile as st
import safetile.lang as sl


@st.kernel
def softmax(x: st.In[st.floats, 2], z: st.Out[st.floats, 2]):
    row = x.load(z.index, z.shape, padding=float("-inf")).astype(st.f32)
    e = sl.exp(row - sl.max(row, 1)[:, None])
    z.store(e / sl.sum(e, 1)[:, None])


def run(rows: int, cols: int, dtype) -> bool:
    block = 1 << (cols - 1).bit_length()
    x = st.randn((rows, cols), dtype=dtype, seed=rows)
    expected = torch.softmax(x.to_torch().float(), dim=1)
    x, z = softmax(x, st.empty((rows, cols), dtype=dtype).partition((4, block))).sync()
    result = z.unpartition().to_torch().float()
    tol = 1e-6 if dtype is st.f32 else 1e-2
    ok = torch.allclose(result, expected, atol=tol, rtol=tol)
    print(f"02_softmax: {rows}x{cols} {dtype.name}: {'matches torch' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    results = [run(37, 1000, st.f32), run(64, 256, st.bf16), run(10, 3, st.f16)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
