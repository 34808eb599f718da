"""The project around the code: license, metadata, the GPU skip reason, the console script."""
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_license_file_is_the_apache_license_the_metadata_names():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    meta = project()
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]


def test_the_metadata_names_authors_and_urls():
    meta = project()
    assert meta["name"] == "safetile"
    assert meta["authors"] and all(a.get("name") for a in meta["authors"])
    assert {"Homepage", "Documentation", "Repository", "Issues"} <= set(meta["urls"])
    assert "Typing :: Typed" in meta["classifiers"]


def test_the_readme_links_the_guide():
    assert "(docs/guide.md)" in (ROOT / "README.md").read_text()


def test_gpu_tests_skip_saying_they_need_a_cuda_gpu(monkeypatch):
    # tests/conftest.py by path: a plain `import conftest` may find tests/grout/conftest.py
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)

    class Item:
        keywords = {"gpu": True}

        def __init__(self):
            self.markers = []

        def add_marker(self, marker):
            self.markers.append(marker)

    monkeypatch.setattr(conftest, "_cuda_available", lambda: False)
    item = Item()
    conftest.pytest_collection_modifyitems(None, [item])
    assert [m.kwargs["reason"] for m in item.markers] == ["needs a CUDA GPU"]


def test_the_grout_console_script_resolves_once_grout_is_in_the_tree():
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["grout"]
    module, _, attr = target.partition(":")
    if not (ROOT / "src" / "grout").is_dir():
        pytest.skip(f"src/grout is not in the tree yet: the `grout` console script ({target}) "
                    f"cannot run until the grout engine lands")
    assert callable(getattr(importlib.import_module(module), attr))
