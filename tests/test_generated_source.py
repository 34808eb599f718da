"""The generated Triton source of the library's kernels stays what was recorded: a change of
the launch path must not change a kernel (tests/generated_cases.py records it again)."""
import json

import pytest

from generated_cases import CASES, GOLDEN, generated_source

RECORDED = json.loads(GOLDEN.read_text())


def test_every_case_is_recorded():
    assert sorted(RECORDED) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_source_is_unchanged(name):
    assert generated_source(name) == RECORDED[name]
