"""`mmgate generate`'s arguments, refused before any call."""

from __future__ import annotations

import pytest

from services.cli.commands import main


def test_a_stream_of_several_samples_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["generate", "Hi", "--stream", "-n", "2"])
    assert exited.value.code == 2
    assert "--stream shows one sample" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "Hi", "-n", "0"])
    assert "at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "Hi", "--video", "clip.avi", "--frames", "0"])
    assert "at least 1" in capsys.readouterr().err
