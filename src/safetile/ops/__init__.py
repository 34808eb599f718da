"""The kernel library, written in the safe language (no ``unsafe`` anywhere but the twins).

Convention, shared by every op:

- ``ops.name(inputs..., [scalars such as eps,] outputs=None..., [workspace=None,] *,
  options) -> DeviceOp``: the outputs are ``out`` for most ops, named ones where an op has
  several (``add_rmsnorm``'s ``out, residual_out``; ``rmsnorm_gemv_argmax``'s ``logits,
  token``), and the caches an append writes in place (``kv_append``'s ``k_cache, v_cache``,
  required). Nothing runs until the op is synced, awaited, chained or recorded. The op's
  output is its result tensor, or a tuple of them for ops with several results
  (``add_rmsnorm`` gives ``(residual_sum, normed)``)::

      z = ops.add(x, y).sync()
      s, h = ops.add_rmsnorm(x, residual, weight, eps).sync()

- Arguments are checked when the op is built, before anything is launched: a wrong one is
  an ``ArgumentError`` naming the op and the argument. Option flags are bools (a truthy
  string is refused), counts and sizes ints (numpy ints too), tile sizes powers of two.
- Inputs are ``Tensor`` or ``Shared`` handles, and one tensor may feed several inputs. The
  op reads a fresh view of a Tensor (the handle stays usable) and holds a Shared handle
  while it is in flight (the same handle for every input it feeds: the op makes no other);
  either way the input's memory cannot be written until the op is synchronized. A graph
  recorded from an op holds no handle of its inputs: each replay borrows their bytes while
  it runs. No dtype is converted implicitly.
- Outputs the caller does not pass are allocated. Passing ``out=`` (and ``workspace=`` where
  an op needs scratch) makes an op allocate nothing, so it can be recorded in a graph scope
  and replayed: grout's decode step preallocates every buffer. A given ``out`` must have the
  result's exact shape and dtype; the op partitions a fresh *view* of it, so the caller's
  handle stays valid and holds the result after the op.
- An output may share memory with no input and no other output (safe ops cannot write what
  they read): an op refuses it with ``AliasError`` when it is built, before any launch,
  also an op of several launches. In-place updates alternate between two buffers.
- An op of several launches (``argmax``, ``rmsnorm_gemv_argmax``, ``decode_attention`` with
  splits, ``matmul`` split-K or head/tail, ``qk_norm_rope_kv_append`` over a long cache,
  ``sample``) borrows, when it is built, the bytes its later launches write, and the inputs
  only they read, as one launch borrows its own: until the op has run, the host cannot take
  or read what they write, nor take or write what they read, and no other launch can write
  either. The later launches use views taken when the op is built, so moving a handle or
  reassigning a workspace field meanwhile changes nothing they touch.
- Math on fp16/bf16 inputs runs in fp32 and is rounded to the input dtype where the Hugging
  Face Qwen3 reference rounds, so results match it.

``host`` holds the shared host-side helpers; ``unsafe_twins`` (not imported here) exists only
to measure the cost of safety.
"""
from .argmax import ArgmaxWorkspace, argmax, argmax_workspace  # noqa: F401
from .copy import add_scalar, copy  # noqa: F401
from .decode_attention import (decode_attention, decode_attention_merge,  # noqa: F401
                               decode_attention_split)
from .decode_workspace import DecodeWorkspace  # noqa: F401
from .flash_attention import flash_attention  # noqa: F401
from .kv_cache import kv_append, kv_append_many, max_cache_positions  # noqa: F401
from .elementwise import add, mul, silu_mul  # noqa: F401
from .embedding import embedding  # noqa: F401
from .gemv import GemvConfig, gemv  # noqa: F401
from .matmul import MatmulConfig, linear, matmul  # noqa: F401
from .norm import add_rmsnorm, rmsnorm  # noqa: F401
from .rope import inv_freq_table, rope  # noqa: F401
from .sampling import (SamplerWorkspace, sample, sampler_workspace,  # noqa: F401
                       sampling_key, sampling_params)
from .softmax import softmax  # noqa: F401
from .fused_gemv import gemv_add, rmsnorm_gemv, silu_mul_gemv_add  # noqa: F401
from .gemv_argmax import gemv_argmax_workspace, rmsnorm_gemv_argmax  # noqa: F401
from .qk_rope_append import qk_norm_rope, qk_norm_rope_kv_append  # noqa: F401
from .prologue_attention import (prologue_attention_fits,  # noqa: F401
                                 qk_norm_rope_append_attention)
from .early_attention import early_attention_fits, qk_norm_rope_attention  # noqa: F401

__all__ = [
    "add", "mul", "silu_mul", "embedding", "rmsnorm", "add_rmsnorm", "rope", "inv_freq_table",
    "softmax", "argmax", "argmax_workspace", "ArgmaxWorkspace", "matmul", "linear",
    "MatmulConfig", "gemv", "GemvConfig", "flash_attention", "decode_attention",
    "decode_attention_split", "decode_attention_merge", "DecodeWorkspace", "kv_append",
    "kv_append_many", "max_cache_positions", "sample", "sampler_workspace", "SamplerWorkspace",
    "sampling_key",
    "sampling_params", "copy", "add_scalar", "rmsnorm_gemv", "gemv_add", "silu_mul_gemv_add",
    "rmsnorm_gemv_argmax", "gemv_argmax_workspace", "qk_norm_rope", "qk_norm_rope_kv_append",
    "qk_norm_rope_append_attention", "prologue_attention_fits", "qk_norm_rope_attention",
    "early_attention_fits",
]
