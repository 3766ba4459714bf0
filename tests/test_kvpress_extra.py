"""attsvm.integrations.kvpress without kvpress: lazy import, the extra named, the budget rule and its bad input."""

from __future__ import annotations

import sys

import pytest

from attsvm._extras import MissingExtraError
from attsvm.integrations import kvpress as kvp


def test_importing_the_module_does_not_import_kvpress():
    import subprocess

    code = (
        "import sys; import attsvm.integrations.kvpress as k; "
        "assert 'kvpress' not in sys.modules, 'imported kvpress eagerly'; print(k.compute_n_kept(10, 0.5))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "5"


def test_a_missing_kvpress_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "kvpress", None)  # as if not installed (import raises ModuleNotFoundError)
    with pytest.raises(MissingExtraError, match=r'pip install "kvpress==0.5.5".*pip install -e "\.\[kvpress\]"'):
        kvp.SVMarginPress  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'NoSuchPress'"):
        kvp.NoSuchPress  # noqa: B018


# 40 · (1 − 0.9) is 3.99… in floating point, and int() makes it 3, as in kvpress
@pytest.mark.parametrize(
    ("k_len", "ratio", "kept"), [(40, 0.0, 40), (40, 0.25, 30), (40, 0.5, 20), (40, 0.9, 3), (3, 0.9, 1), (7, 0.5, 3)]
)
def test_compute_n_kept_is_kvpress_rule(k_len, ratio, kept):
    assert kvp.compute_n_kept(k_len, ratio) == kept


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_a_compression_ratio_outside_0_1_is_named(bad):
    with pytest.raises(ValueError, match="compression_ratio must be in"):
        kvp.compute_n_kept(10, bad)
    with pytest.raises(TypeError, match="compression_ratio must be a float"):
        kvp.check_compression_ratio("0.5")
