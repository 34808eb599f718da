"""grout's command line answers a command other CLIs have with the one it has instead."""
import pytest

from grout import cli


def test_grout_chat_is_told_to_use_generate_chat_or_serve(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["chat", "--model", "tiny"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "there is no `grout chat`" in err
    assert "grout generate --model M --chat --prompt TEXT" in err and "grout serve" in err
