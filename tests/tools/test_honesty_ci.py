"""Under CI (``CI=true``, exported by ``.ci/run``) a skip for something missing fails.

CI installs every extra the suite uses and has a PoCL device: a module-level ``importorskip``
(flwr, onnxruntime) or a skip for a missing device there means the run tested less than it
reports. ``tests/conftest.py`` turns those into failures; skips for a capability the device
lacks (unified memory, image sharing, cl_khr_fp16) stay skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import missing_in_ci

#: Skip reasons the suite gives on purpose, on devices without the capability.
INTENDED = ["zero-copy without transfers needs a unified-memory device",
            "pthread-AMD EPYC has no cl_khr_image2d_from_buffer: images are copies here",
            "the device shares images with buffers: nothing refuses here", "this device has cl_khr_fp16",
            "a device with memory of its own stages the batch", "zero-copy needs unified memory",
            "this torch has no bundled AOTAutograd cache"]
MISSING = ["could not import 'flwr': No module named 'flwr'",
           "the federated extra (pip install '.[federated]') is not installed",
           "no OpenCL device is available", "No OpenCL platform was found"]


def test_only_skips_for_something_missing_fail_and_only_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    assert all(missing_in_ci(reason) is None for reason in INTENDED + MISSING)
    monkeypatch.setenv("CI", "true")
    assert [r for r in INTENDED if missing_in_ci(r) is not None] == []
    assert [r for r in MISSING if missing_in_ci(r) is None] == []


def test_a_pytest_run_under_ci_fails_missing_modules_and_devices(tmp_path):
    """End to end, in a pytest run of its own with this suite's conftest: a module-level
    importorskip (with its own reason) fails collection, a test's importorskip and a missing
    device fail, an intended skip and an xfail stay what they are."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("suite_conftest", {str(Path(__file__).parents[1] / "conftest.py")!r})
        suite = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(suite)
        pytest_configure = suite.pytest_configure
        pytest_runtest_makereport = suite.pytest_runtest_makereport
        pytest_make_collect_report = suite.pytest_make_collect_report
    """))
    (tmp_path / "test_module_skip.py").write_text(textwrap.dedent("""
        import pytest
        pytest.importorskip("torch_adreno_no_such_module", reason="the extra is not installed")
        def test_never_collected(): pass
    """))
    (tmp_path / "test_skips.py").write_text(textwrap.dedent("""
        import pytest
        def test_missing_module(): pytest.importorskip("torch_adreno_no_such_module")
        def test_missing_device(): pytest.skip("no OpenCL device is available")
        def test_intended(): pytest.skip("zero-copy without transfers needs a unified-memory device")
        @pytest.mark.xfail(reason="not installed here either", strict=True)
        def test_xfail(): assert False
        def test_passes(): pass
    """))
    env = {**os.environ, "CI": "true"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                             "--continue-on-collection-errors", str(tmp_path)],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    for outcome, test in [("ERROR", "test_module_skip.py"), ("FAILED", "test_skips.py::test_missing_module"),
                          ("FAILED", "test_skips.py::test_missing_device"), ("SKIPPED", "test_skips.py"),
                          ("XFAIL", "test_skips.py::test_xfail"), ("PASSED", "test_skips.py::test_passes")]:
        assert any(line.startswith(outcome) and test in line for line in lines), (outcome, test, result.stdout[-3000:])
    assert "1 skipped" in lines[-1] and "2 failed" in lines[-1], lines[-1]
