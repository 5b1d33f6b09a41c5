"""The server command refuses an interpreter whose numpy the 2.51 Python backend stub cannot read."""
from __future__ import annotations

import importlib.metadata

import pytest

from omni_backend.supervisor import server_binary


def _numpy(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    real = importlib.metadata.version

    def version_of(name: str) -> str:
        if name != "numpy":
            return real(name)
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", version_of)


@pytest.mark.parametrize("version", ["2.0.0", "2.5.2"])
def test_numpy_2_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    _numpy(monkeypatch, version)
    with pytest.raises(SystemExit, match=rf"numpy {version} .*BYTES.*numpy<2"):
        server_binary.command(["--model-repository=/nonexistent"])


@pytest.mark.parametrize("version", ["1.26.4", "1.21.0", None])
def test_numpy_1_or_none_starts(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    _numpy(monkeypatch, version)
    argv = server_binary.command(["--model-repository=/nonexistent"])
    assert argv[-1] == "--model-repository=/nonexistent"
    assert any(a.startswith("--backend-directory=") for a in argv)
