"""Bad command-line input ends in a one-line message and exit status 2 before any work starts:
argparse types for every number, choices for every name, the device looked up first."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from torch_adreno.cli import main


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The error argparse printed for ``argv`` (which must exit with status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "--batch-size", "0"], r"--batch-size: expected an integer >= 1, got '0'"),
    (["train", "--batch-size", "-3"], r"--batch-size: expected an integer >= 1, got '-3'"),
    (["train", "--epochs", "0"], r"--epochs: expected an integer >= 1, got '0'"),
    (["train", "--epochs", "two"], r"--epochs: expected an integer >= 1, got 'two'"),
    (["train", "--lr", "0"], r"--lr: expected a number > 0, got '0'"),
    (["train", "--lr", "nan"], r"--lr: expected a number > 0, got 'nan'"),
    (["train", "--lr", "inf"], r"--lr: expected a number > 0, got 'inf'"),
    (["train", "--seed", "-1"], r"--seed: expected an integer >= 0, got '-1'"),
    (["train", "--device", " "], r"--device: expected a device index or a name substring"),
    (["train", "--optimizer", "lbfgs"], r"--optimizer: invalid choice: 'lbfgs'"),
    (["bench", "--variants", "nosuch"], r"--variants: invalid choice: 'nosuch' \(choose from .*fused\+reuse"),
    (["bench", "--models", "mlp", "nosuch"], r"--models: invalid choice: 'nosuch' \(choose from .*lenet"),
    (["bench", "--steps", "0"], r"--steps: expected an integer >= 1, got '0'"),
    (["bench", "--device", ""], r"--device: expected a device index or a name substring"),
])
def test_bad_arguments_are_refused_by_name(capsys, argv, message):
    assert re.search(message, _refused(capsys, *argv))


def test_an_output_path_that_is_a_file_is_refused(capsys, tmp_path):
    a_file = tmp_path / "results"
    a_file.write_text("")
    assert "is a file, not a directory" in _refused(capsys, "bench", "--out", str(a_file))


def test_every_option_has_help_and_numbers_show_their_defaults(capsys):
    for command, options in [("train", ["--device", "--epochs", "--batch-size", "--lr", "--optimizer", "--seed",
                                        "--table"]),
                             ("bench", ["--models", "--variants", "--steps", "--device", "--out"])]:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())  # help wraps lines at the terminal width
        for option in options:
            described = re.search(re.escape(option) + r"(?: [A-Z_]+(?: \[[A-Z_ .]+\])?| \{[a-z,]+\})? (\S+)", text)
            assert described and not described.group(1).startswith("-"), (command, option, text)
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 8)", "(default: 64)", "(default: 0.002)", "(default: adam)", "(default: 0)"):
        assert default in text, default


def test_top_level_help_lists_every_command_in_plain_text(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text
    for command in ("devices", "ops", "train", "bench", "opinfo"):
        assert re.search(rf"^\s+{command}\s+\S", text, re.MULTILINE), command


@pytest.mark.device
def test_a_batch_larger_than_the_training_set_is_refused(capsys):
    assert main(["train", "--batch-size", "100000"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"--batch-size 100000 is larger than the \d+ training digits; pass at most \d+", err)


@pytest.mark.parametrize("command", ["train", "bench"])
def test_an_unknown_device_is_named_before_any_work_starts(command):
    """In a fresh process: the first thing printed is the device message (the available devices
    and how to pick one), with no progress bar and no Dynamo traceback before it."""
    done = subprocess.run([sys.executable, "-m", "torch_adreno", command, "--device", "no-such-device"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: no OpenCL device matches 'no-such-device'"), done.stderr
    assert "Traceback" not in done.stderr and "training" not in done.stderr and "benchmark" not in done.stderr
    assert done.stdout == ""
