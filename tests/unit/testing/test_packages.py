"""The shape of the ``gpu``, ``selfcheck`` and ``testing`` packages: what they export, and that importing
them stays cheap (no numpy, no pynvml: the plugin imports them on every pytest run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pytest_kvcache.selfcheck


def test_gpu_and_testing_reexport_nothing() -> None:
    code = (
        "import pytest_kvcache.gpu as g, pytest_kvcache.testing as t\n"
        "print([sorted(k for k in vars(m) if not k.startswith('_')) for m in (g, t)], bool(g.__doc__ and t.__doc__))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[[], []] True"


def test_selfcheck_exports_exactly_the_check() -> None:
    from pytest_kvcache.selfcheck import check

    assert pytest_kvcache.selfcheck.__all__ == ["overhead_warning", "run_self_check"]
    assert pytest_kvcache.selfcheck.run_self_check is check.run_self_check
    assert pytest_kvcache.selfcheck.overhead_warning is check.overhead_warning
    with pytest.raises(AttributeError, match="compare"):
        _ = pytest_kvcache.selfcheck.compare


def test_importing_the_packages_is_cheap() -> None:
    code = (
        "import sys\n"
        "import pytest_kvcache.gpu, pytest_kvcache.gpu.state, pytest_kvcache.selfcheck\n"
        "import pytest_kvcache.selfcheck.stream, pytest_kvcache.testing, pytest_kvcache.testing.fake_nvml\n"
        "import pytest_kvcache.testing.stream_faults\n"
        "print(sorted(m for m in ('numpy', 'pandas', 'pynvml', 'matplotlib') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
