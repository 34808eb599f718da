"""Element-wise add: each program owns one 1024-element tile of z.

Runs on the GPU when one is present, else on the CPU executor; checks against torch.
"""
import sys

import torch

import safetile as st
import safetile.lang as sl


@st.kernel
def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


def main() -> int:
    n = (1 << 20) + 123                          # not a multiple of the tile: edge tile masked
    x, y = st.randn((n,), seed=1), st.randn((n,), seed=2)
    expected = x.to_torch() + y.to_torch()
    x, y, z = add(x, y, st.empty((n,)).partition((1024,))).sync()
    result = z.unpartition().to_torch()
    ok = torch.equal(result, expected)
    print(f"01_vector_add: n={n} on {result.device}: {'matches torch' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
