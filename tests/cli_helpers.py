"""Helpers of the CLI tests: run ``hetrl`` in-process and check a user error's one line."""

from __future__ import annotations

from hetrl.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``hetrl *argv`` run in-process."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code: int, err: str, *fragments: str, command: str = "") -> str:
    """Exit code 2, one line on stderr (``hetrl [command]: error: ...``, containing every
    fragment), no traceback. Returns the line."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith(f"hetrl {command}" if command else "hetrl ") and \
        ": error: " in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
