"""``python -m attsvm._warm`` (what ``make install`` runs): the kernel groups compiled in processes of their own."""

from __future__ import annotations

import subprocess

import pytest

from attsvm import _warm


class _Proc:
    def __init__(self, code: int) -> None:
        self.code = code

    def wait(self) -> int:
        return self.code


def _fake_popen(monkeypatch: pytest.MonkeyPatch, codes: dict[str, int]) -> list[tuple[list[str], dict[str, str]]]:
    started: list[tuple[list[str], dict[str, str]]] = []

    def popen(argv: list[str], env: dict[str, str]) -> _Proc:
        started.append((argv, env))
        return _Proc(codes[argv[-1]])

    monkeypatch.setattr(subprocess, "Popen", popen)
    return started


def test_each_group_is_compiled_in_a_process_of_its_own_without_the_preload(monkeypatch, capsys):
    started = _fake_popen(monkeypatch, dict.fromkeys(_warm.PARTS, 0))
    monkeypatch.setattr(_warm.os, "cpu_count", lambda: 2)
    assert _warm.main([]) == 0
    assert sorted(argv[-1] for argv, _ in started) == sorted(_warm.PARTS) == ["frobenius", "nuclear", "span"]
    assert all(argv[1:4] == ["-m", "attsvm._warm", "--part"] for argv, _ in started)
    assert all(env["ATTSVM_PRELOAD"] == "0" for _, env in started)
    assert "numba kernels compiled" in capsys.readouterr().out


def test_a_failing_group_is_named_and_without_numba_nothing_is_compiled(monkeypatch, capsys):
    _fake_popen(monkeypatch, {"frobenius": 0, "nuclear": 1, "span": 0})
    with pytest.raises(SystemExit, match="compiling the nuclear kernels failed"):
        _warm._compile_parallel()
    _fake_popen(monkeypatch, dict.fromkeys(_warm.PARTS, 3))  # (each part's status without numba)
    monkeypatch.setattr(_warm.os, "cpu_count", lambda: 2)
    assert _warm.main([]) == 0
    assert "not used (no numba)" in capsys.readouterr().out


def test_a_part_compiles_its_group_in_this_process(monkeypatch):
    pytest.importorskip("numba")
    from attsvm.training import _span_compiled

    ran: list[str] = []
    monkeypatch.setitem(_warm.PARTS, "span", lambda: ran.append("span") or _warm.compile_span())
    assert _warm.main(["--part", "span"]) == 0 and ran == ["span"]
    assert len(_span_compiled._advance_range.signatures) >= 1
    monkeypatch.setitem(_warm.PARTS, "span", lambda: False)
    assert _warm.main(["--part", "span"]) == 3


@pytest.mark.parametrize("argv, cpus", [(["--serial"], 2), ([], 1)])
def test_serial_or_one_core_compiles_in_this_process(monkeypatch, capsys, argv, cpus):
    def no_process(*a, **k):
        raise AssertionError("no process may be started")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setattr(_warm.os, "cpu_count", lambda: cpus)
    ran: list[str] = []
    monkeypatch.setattr(_warm, "compile_all", lambda: ran.append("all") or True)
    assert _warm.main(argv) == 0 and ran == ["all"]
    assert "numba kernels compiled" in capsys.readouterr().out
