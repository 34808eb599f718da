"""An op that is built and dropped without being run warns, naming the line that built it."""
import asyncio
import gc
import inspect
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import safetile as st
from safetile import ops
from safetile.tensor import active_holds

from support import add

pytestmark = pytest.mark.usefixtures("cpu")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cpu():
    with st.backend("interpret", seed=0):
        yield


def vec(n=4):
    return st.ones((n,))


def out(n=4):
    return st.empty((n,)).partition((2,))


def line_of(marker: str) -> int:
    """The line of this file holding ``marker`` in a comment."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}"))


def dropped(build):
    """The warnings recorded while ``build()``'s op is dropped."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        op = build()
        del op
        gc.collect()
    return [w for w in seen if issubclass(w.category, st.UnrunOpWarning)]


def test_an_op_dropped_unrun_warns_naming_the_line_that_built_it():
    seen = dropped(lambda: add(vec(), vec(), out()))  # built-here
    assert len(seen) == 1
    w = seen[0]
    assert (w.filename, w.lineno) == (__file__, line_of("built-here"))
    text = str(w.message)
    assert "kernel 'add'" in text and f"{__file__}:{line_of('built-here')}" in text
    assert "op.sync()" in text and "await op" in text


def test_an_op_built_by_a_library_op_names_the_callers_line_not_safetile():
    seen = dropped(lambda: ops.add(vec(), vec()))  # library-op
    assert [(w.filename, w.lineno) for w in seen] == [(__file__, line_of("library-op"))]


def test_the_dropped_ops_arguments_are_handed_back():
    x = vec()
    assert len(dropped(lambda: add(x, vec(), out()))) == 1
    assert x.to_torch().tolist() == [1, 1, 1, 1]
    assert active_holds() == []


def test_ops_that_run_do_not_warn():
    def run_all():
        add(vec(), vec(), out()).sync()
        add(vec(), vec(), out()).then(lambda x, y, z: add(x, y, out())).sync()
        st.zip(add(vec(), vec(), out()), ops.add(vec(), vec())).sync()
        asyncio.run(_awaited())
        g = add(vec(), vec(), out()).graph()
        g.launch().sync()
        return None

    assert dropped(run_all) == []


async def _awaited():
    await add(vec(), vec(), out())


def test_ops_handed_back_by_a_failed_execution_do_not_warn():
    def fail():
        with pytest.raises(st.ExecutionError):
            st.zip(add(vec(), vec(), out()), "not an op")
        with pytest.raises(st.LaunchError):
            add(vec(), vec(), out()).then(lambda x, y, z: add(x, y, z.unpartition())).sync()

    assert dropped(fail) == []


def test_a_graph_replay_dropped_unrun_warns():
    g = add(vec(), vec(), out()).graph()
    seen = dropped(lambda: g.launch())  # replay-built
    assert [(w.filename, w.lineno) for w in seen] == [(__file__, line_of("replay-built"))]
    assert "a replay of" in str(seen[0].message)


def test_the_warning_is_a_runtime_warning_shown_by_default(tmp_path):
    assert issubclass(st.UnrunOpWarning, RuntimeWarning)
    script = ("import safetile as st, safetile.lang as sl\n"
              "@st.kernel\n"
              "def k(x: st.In[st.f32], z: st.Out[st.f32]):\n"
              "    z.store(sl.load_like(x, z))\n"
              "op = k(st.ones((4,)), st.empty((4,)).partition((4,)))\n"
              "del op\n")
    env = dict(os.environ, SAFETILE_BACKEND="interpret",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH")])))
    env.pop("PYTHONWARNINGS", None)
    path = tmp_path / "forgot_sync.py"
    path.write_text(script)
    proc = subprocess.run([sys.executable, str(path)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"{path}:5: UnrunOpWarning: kernel 'k'" in proc.stderr


def test_recording_the_building_site_formats_no_traceback():
    import safetile.device.unrun as unrun
    source = inspect.getsource(unrun.building_site)
    assert "sys._getframe" in source
    assert "traceback" not in source and "extract_stack" not in source


def test_unpacking_an_op_that_was_not_run_says_to_sync_or_await_it():
    op = add(vec(), vec(), out())
    with pytest.raises(st.NotRunError, match=r"x, y, z = op\.sync\(\)`, or `x, y, z = await op"):
        x, y, z = op
    assert isinstance(op.sync()[0], st.Tensor)          # the refused unpacking ran nothing


def test_indexing_an_op_that_was_not_run_is_a_not_run_error_and_a_type_error():
    op = add(vec(), vec(), out())
    with pytest.raises(TypeError, match="cannot be indexed: a launch only builds a lazy op"):
        op[2]
    op.sync()


def test_an_unawaited_op_unpacked_in_a_coroutine_says_to_await_it():
    async def main():
        x, y, z = add(vec(), vec(), out())              # forgot `await`

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", st.UnrunOpWarning)
        with pytest.raises(st.NotRunError, match="await op") as e:
            asyncio.run(main())
        del e                                           # the traceback held the dropped op
        gc.collect()
    assert [w.category for w in seen] == [st.UnrunOpWarning]
