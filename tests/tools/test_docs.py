"""The documentation: the site under docs/ builds with ``mkdocs build --strict`` and no warning, the
generated parts hold what they are generated from, the README stays a short front door whose
setup commands are CI's, and neither the README nor the docs name development rounds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: The README's setup commands, which .ci/run runs (the README says so: they must stay the same).
SETUP_COMMANDS = ('pip install "torch==2.13.0" -e ".[test]" --extra-index-url https://download.pytorch.org/whl/cpu '
                  '--retries 1', "python -m pytest -n 2 --dist loadgroup")
#: Wording that names development rounds (a numbered or "this"/"last" session) rather than the product.
ROUNDS = re.compile(r"session[ _-]?\d+|\b(?:this|last|next|previous) session\b", re.IGNORECASE)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: What the API reference documents (mkdocstrings' anchors).
API_OBJECTS = ("torch_adreno.training.step.TrainingStep", "torch_adreno.training.buckets.Buckets",
               "torch_adreno.profiler.profile", "torch_adreno.runtime.host_writes.mark_changed",
               "torch_adreno.frontend.adreno_backend", "torch_adreno.config.Config", "torch_adreno.config.OPTIONS",
               "torch_adreno.export.export_step", "torch_adreno.replay.captured.CapturedStep",
               "torch_adreno.export.load_state", "torch_adreno.runner.StepRunner")


def _doc_sources() -> list[Path]:
    return [README, ROOT / "mkdocs.yml", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs").rglob("*.py"))]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        pytest.importorskip(module)
    out = tmp_path_factory.mktemp("site")
    environ = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                            cwd=ROOT, capture_output=True, text=True, env=environ, timeout=600)
    return result, out


def test_the_site_builds_strictly_without_a_warning(site: tuple[Any, Path]) -> None:
    result, out = site
    output = ANSI.sub("", result.stdout + result.stderr)
    problems = [line for line in output.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert result.returncode == 0 and not problems, output[-6000:]
    assert (out / "index.html").is_file() and (out / "performance" / "index.html").is_file()


def test_the_options_page_lists_every_option_with_its_variable(site: tuple[Any, Path]) -> None:
    from torch_adreno.config import OPTIONS

    page = (site[1] / "guide" / "options" / "index.html").read_text()
    missing = [name for name, spec in OPTIONS.items()
               if f"<code>{name}</code>" not in page or (spec.env and f"<code>{spec.env}</code>" not in page)]
    assert not missing, f"options missing from the options page: {missing}"


def test_the_api_reference_renders_every_documented_object(site: tuple[Any, Path]) -> None:
    page = (site[1] / "reference" / "api" / "index.html").read_text()
    missing = [name for name in API_OBJECTS if f'id="{name}"' not in page]
    assert not missing, missing
    assert "max_grad_norm" in page  # TrainingStep's __init__ docstring, merged into the class


def test_the_performance_page_gives_each_table_its_command_and_date(site: tuple[Any, Path]) -> None:
    page = (site[1] / "performance" / "index.html").read_text()
    tables, commands = page.count("<table>"), page.count("Reproduce:")
    assert tables >= 9 and commands >= 9, (tables, commands)
    assert re.search(r"measured (\d{4}-\d{2}-\d{2})", page)


def test_the_readme_is_a_front_door_with_cis_setup_commands() -> None:
    size = README.stat().st_size
    assert size <= 16 * 1024, f"README.md is {size} bytes: keep it a front door (<= 16 KB), move detail to docs/"
    text = README.read_text()
    section = text.split("## Set up and test", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    assert tuple(block.strip().splitlines()) == SETUP_COMMANDS, block
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd ", "export "))]
    assert tuple(ci) == SETUP_COMMANDS, "the README's setup commands must be .ci/run's, exactly"


def test_the_readme_setup_takes_the_cpu_build_and_says_how_to_pick_another() -> None:
    """PyPI's default Linux torch is the CUDA build with its CUDA packages (several GB): the setup
    names PyTorch's CPU index, and the README says how to pick a CUDA, ROCm or Termux build."""
    setup = SETUP_COMMANDS[0].split()
    assert setup[setup.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    section = README.read_text().split("## Set up and test", 1)[1].split("\n## ", 1)[0]
    assert all(word in section for word in ("CUDA", "ROCm", "Termux", "pkg install python-torch", "2.13.0+cpu"))


def test_readme_and_docs_name_no_development_rounds() -> None:
    hits = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in _doc_sources()
            for number, line in enumerate(path.read_text().splitlines(), 1) if ROUNDS.search(line)]
    assert not hits, "\n".join(hits)


def test_no_file_is_named_after_a_development_round() -> None:
    skipped = {".git", "build", "site", "__pycache__", "node_modules"}
    named = []
    for directory, subdirectories, files in os.walk(ROOT):
        subdirectories[:] = [d for d in subdirectories
                             if d not in skipped and not d.startswith(".") and not d.endswith(".egg-info")]
        named += [os.path.relpath(os.path.join(directory, f), ROOT)
                  for f in files + subdirectories if re.search(r"session[_-]?\d+", f, re.IGNORECASE)]
    assert not named, named
