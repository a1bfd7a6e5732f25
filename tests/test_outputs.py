"""Outputs checked before work (issue 28): every output file or folder that cannot be written
(/proc, /sys, an immutable file, a file named as a folder) fails at once with one line and exit
2, before any search, simulation or run; an OS error while writing is one line too."""

from __future__ import annotations

import errno
import shutil
import subprocess

import pytest

from hetrl.errors import SpecError
from hetrl.io import check_output_dir, check_output_path, write_text_atomic
from tests.cli_helpers import assert_user_error, run

JOB = ["-w", "qwen3-8b-ppo-sync", "-c", "a100x8"]


@pytest.fixture
def immutable(tmp_path):
    """A file with the immutable attribute (root and a file system that has it), removed after."""
    path = tmp_path / "locked.json"
    path.write_text("{}")
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(path)], capture_output=True, check=False).returncode != 0:
        pytest.skip("chattr +i is not available here")
    yield path
    subprocess.run(["chattr", "-i", str(path)], check=False)


@pytest.mark.parametrize("argv,option", [
    (["plan", *JOB, "--budget-evals", "5", "-o", "/proc/plan.json"], "--out"),
    (["estimate", *JOB, "--colocate", "--tp", "4", "--save-plan", "/sys/plan.json"],
     "--save-plan"),
    (["simulate", *JOB, "-p", "missing.json", "--trace-raw", "/proc/t.json"], "--trace-raw"),
    (["simulate", *JOB, "-p", "missing.json", "--trace", "/sys/t.json"], "--trace"),
    (["simulate", *JOB, "-p", "missing.json", "--chrome-trace", "/proc/t.json"],
     "--chrome-trace"),
    (["run", *JOB, "-p", "missing.json", "--chrome-trace", "/proc/t.json"], "--chrome-trace"),
    (["run", *JOB, "-p", "missing.json", "--trace-raw", "/proc/t.json"], "--trace-raw"),
    (["run", *JOB, "-p", "missing.json", "--trace", "/sys/t.json"], "--trace"),
    (["calibrate", "-t", "x.json", "-o", "/proc/params.yaml"], "--out"),
    (["profile", "-n", "1", "-o", "/sys/cluster.yaml"], "--out"),
])
def test_unwritable_outputs_fail_before_any_work(capsys, argv, option):
    code, out, err = run(capsys, *argv)
    assert out == ""
    assert_user_error(code, err, option, "cannot create files in /")


def test_an_immutable_output_file_fails_at_once(capsys, immutable):
    code, _, err = run(capsys, "estimate", *JOB, "--colocate", "--tp", "4",
                       "--save-plan", immutable)
    assert_user_error(code, err, "--save-plan", str(immutable), "read-only or immutable",
                      command="estimate")


def test_checkpoint_dir_naming_a_file_fails_at_once(capsys, tmp_path):
    a_file = tmp_path / "ckpt"
    a_file.write_text("")
    code, _, err = run(capsys, "run", *JOB, "-p", "missing.json", "--checkpoint-dir", a_file)
    assert_user_error(code, err, "--checkpoint-dir", "is a file, not a directory", command="run")
    code, _, err = run(capsys, "run", *JOB, "-p", "missing.json",
                       "--checkpoint-dir", "/proc/ckpt")
    assert_user_error(code, err, "--checkpoint-dir", "cannot create files in /proc",
                      command="run")


def test_output_checks_name_the_field_and_the_reason(tmp_path):
    with pytest.raises(SpecError, match="is a directory"):
        check_output_path(tmp_path, "--out")
    with pytest.raises(SpecError, match="not a regular file"):
        check_output_path("/dev/null", "--out")
    assert check_output_path(tmp_path / "new" / "deeper" / "x.json", "--out").name == "x.json"
    assert check_output_dir(tmp_path / "new" / "dir", "--dir") == tmp_path / "new" / "dir"
    assert not (tmp_path / "new").exists()  # checked, not created
    with pytest.raises(SpecError, match="cannot create files in /sys"):
        check_output_dir("/sys/x/y", "--dir")


def test_an_os_error_while_writing_is_one_spec_error_and_leaves_nothing(tmp_path, monkeypatch):
    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("hetrl.io.os.replace", full)
    with pytest.raises(SpecError, match="--out = .*cannot write: No space left on device"):
        write_text_atomic(tmp_path / "x.json", "{}", "--out")
    assert list(tmp_path.iterdir()) == []


def test_a_write_that_fails_after_the_work_is_one_line(capsys, tmp_path, monkeypatch):
    plan = tmp_path / "plan.json"
    monkeypatch.setattr("hetrl.io.os.replace", lambda *_: (_ for _ in ()).throw(
        OSError(errno.EROFS, "Read-only file system")))
    code, _, err = run(capsys, "estimate", *JOB, "--colocate", "--tp", "4", "--save-plan", plan)
    assert_user_error(code, err, "--save-plan", "cannot write: Read-only file system",
                      command="estimate")
