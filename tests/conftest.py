"""Shared fixtures: a clean Dynamo state per test, and helpers that compare with eager PyTorch.

Under CI (``CI=true``, which ``.ci/run`` exports) a test skipped because something it needs is
missing (a module: ``pytest.importorskip``; an OpenCL device) fails instead: CI installs
everything the suite needs, so such a skip means the run tested less than it says. Intended
skips (a capability this device lacks, such as unified memory) stay skips.
"""

from __future__ import annotations

import os
import re
import tempfile

import pytest
import torch
import torch._dynamo

import torch_adreno  # noqa: F401  (registers the backend when not installed)

#: The native runtime's fixtures (its builds, exported steps), for test_native_step.py and test_remote.py.
pytest_plugins = ["native_fixtures"]
NATIVE_FIXTURES = {"native", "sanitized", "exported", "environment"}

#: Skip reasons that say something the suite needs is missing (a module, the OpenCL device).
MISSING = re.compile(r"could not import|no module named|not installed|\bno opencl\b|no (opencl )?(device|platform)s? "
                     r"(is |are )?(found|available)|(device|platform) (is )?(not found|not available|missing)",
                     re.IGNORECASE)


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def missing_in_ci(reason: str) -> str | None:
    """The failure message for a skip with ``reason`` under CI, or None where it stays a skip."""
    if not in_ci() or not MISSING.search(reason):
        return None
    return f"CI=true: skipped for something missing, which fails under CI: {reason}"


def _importorskip_in_ci(importorskip):
    """``pytest.importorskip`` that fails (at import, so a module-level one fails collection)
    under CI, whatever reason the caller gave."""
    def checked(modname, *args, **kwargs):
        try:
            return importorskip(modname, *args, **kwargs)
        except pytest.skip.Exception as skipped:
            if not in_ci():
                raise
            pytest.fail(f"CI=true: module {modname!r} is missing, which fails under CI ({skipped.msg})", pytrace=False)

    checked.__wrapped__ = importorskip  # type: ignore[attr-defined]
    return checked


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_missing(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        message = missing_in_ci(_skip_reason(report))
        if message is not None:
            report.outcome = "failed"
            report.longrepr = message


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_missing(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_missing(outcome.get_result())


def pytest_configure(config):
    if not hasattr(pytest.importorskip, "__wrapped__"):
        pytest.importorskip = _importorskip_in_ci(pytest.importorskip)
    # Compiled graphs from earlier runs (PyTorch's AOTAutograd cache) must not decide this run's
    # results: each session starts with an empty cache of its own, unless one is given.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torch_adreno_tests_"))
    # Every memory plan a test compiles or captures is proven against what runs.
    os.environ.setdefault("TORCH_ADRENO_VERIFY_MEMORY", "1")
    _choose_suite_device()


#: The CPU runtime the suite prefers where its compiler builds: PoCL, the faster of the two here
#: (the whole suite: ~13 min against ~20 on Intel's runtime on the same machine).
PREFERRED_SUITE_PLATFORM = "Portable Computing Language"


def _choose_suite_device() -> None:
    """Run the suite on PoCL where it builds kernels, else on the default device (Intel's CPU
    runtime where PoCL's LLVM does not know the CPU); ``TORCH_ADRENO_DEVICE`` set by the caller
    wins. ``tests/runtime/test_second_compiler.py`` runs a subset on the other runtime."""
    from torch_adreno.runtime.device import ENV_DEVICE, list_devices

    if os.environ.get(ENV_DEVICE, "").strip():
        return
    for entry in list_devices():
        if entry.platform == PREFERRED_SUITE_PLATFORM and entry.unusable is None:
            os.environ[ENV_DEVICE] = entry.label
            return


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Dynamo's recompile limit would otherwise silently send later tests to eager.
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


#: Under CI, set to 1 to run the ``slow`` tests too (CI's 30 minutes hold the bounded subset only).
ENV_CI_SLOW = "TORCH_ADRENO_CI_SLOW"


def _deselect_slow_in_ci(config, items) -> None:
    """Under CI the ``slow`` tests (larger variants of unmarked ones) are deselected, and said so:
    the whole suite on CI's 2 cores came within minutes of its 30-minute limit."""
    if not in_ci() or os.environ.get(ENV_CI_SLOW) == "1" or config.getoption("-m"):
        return
    slow = [i for i in items if i.get_closest_marker("slow")]
    if not slow:
        return
    config.hook.pytest_deselected(items=slow)
    items[:] = [i for i in items if not i.get_closest_marker("slow")]
    config._torch_adreno_slow_deselected = len(slow)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    count = getattr(config, "_torch_adreno_slow_deselected", 0)
    if count:
        terminalreporter.write_line(f"CI=true: {count} tests marked slow deselected (the bounded subset CI runs; "
                                    f"{ENV_CI_SLOW}=1 or -m slow runs them)")


def pytest_collection_modifyitems(config, items):
    """Under CI the slow tests are deselected (:func:`_deselect_slow_in_ci`); the tests using the
    native runtime's builds run in one worker of a parallel run (``-n 2``: pytest-xdist's
    ``loadgroup``), so that each build is made once; tests marked unified_memory are skipped, with
    the reason, on a discrete device."""
    from torch_adreno.runtime import get_runtime

    _deselect_slow_in_ci(config, items)
    for item in items:
        if NATIVE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("native"))

    marked = [i for i in items if i.get_closest_marker("unified_memory")]
    if not marked:
        return
    try:
        unified = get_runtime(None).profile.unified_memory
    except Exception:  # no device: the device tests report that themselves
        return
    if not unified:
        skip = pytest.mark.skip(reason="zero-copy without transfers needs a unified-memory device")
        for item in marked:
            item.add_marker(skip)
