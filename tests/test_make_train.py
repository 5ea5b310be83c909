"""`make train`: a cleanly interrupted run (exit 130) is not reported by make as an error (issue 27, item 6).

Runs the repository's Makefile in a scratch folder whose venv is a stand-in ``reverie`` script (the venv stamp is
newer than pyproject.toml, so nothing is installed; no system packages are checked).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    fake = bin_dir / "reverie"
    fake.write_text('#!/bin/sh\necho "args: $* make_train=$REVERIE_MAKE_TRAIN"\nexit "$FAKE_STATUS"\n')
    fake.chmod(0o755)
    stamp = tmp_path / ".venv" / ".reverie-installed"
    stamp.write_text("")
    os.utime(tmp_path / "pyproject.toml", (1, 1))  # older than the stamp: no (re)install
    return tmp_path


@pytest.mark.parametrize("status, make_status", [(0, 0), (130, 0), (1, 2), (2, 2)])
def test_an_interrupted_run_ends_make_train_with_success(scratch, status, make_status):
    done = subprocess.run(["make", "--no-print-directory", "train", "ARGS=exp=debug", "GL_PACKAGES=",
                           "BROWSER_PACKAGES="], cwd=scratch, capture_output=True, text=True,
                          env={**os.environ, "FAKE_STATUS": str(status)})
    assert done.returncode == make_status, done.stdout + done.stderr
    assert "args: train exp=debug make_train=1" in done.stdout
    assert ("Error" in done.stderr) == (make_status != 0)  # 130: no "make: *** [...] Error 130"


def test_ctrl_c_in_a_terminal_reaches_reverie_and_make_waits_for_its_checkpoint(scratch, tmp_path):
    """Issue 47: in a real terminal Ctrl-C goes to the whole foreground process group, make included. Under a pty,
    SIGINT to make's group: the stand-in reverie (which traps INT, takes 0.5 s to "checkpoint", prints the resume
    line and exits 130) finishes before make exits; make itself then reports `Interrupt` and dies of SIGINT, as
    the README says."""
    import pty
    import signal
    import time

    mark = tmp_path / "saved"
    fake = scratch / ".venv" / "bin" / "reverie"
    fake.write_text('#!/bin/sh\ntrap \'sleep 0.5; echo "resume: make train ARGS=--resume runs/x"; '
                    'echo saved > "$MARK"; exit 130\' INT\necho started\nwhile :; do sleep 0.1; done\n')
    leader, follower = pty.openpty()
    proc = subprocess.Popen(["make", "--no-print-directory", "train", "GL_PACKAGES=", "BROWSER_PACKAGES="],
                            cwd=scratch, stdin=follower, stdout=follower, stderr=follower, start_new_session=True,
                            env={**os.environ, "MARK": str(mark)})
    os.close(follower)
    out = b""
    try:
        deadline = time.monotonic() + 60
        while b"started" not in out and time.monotonic() < deadline:
            out += os.read(leader, 4096)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        code = proc.wait(timeout=60)
    finally:  # a failure leaves no stand-in looping behind
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    text = out.decode(errors="replace")
    assert mark.read_text() == "saved\n"  # the handler ran to its end before make returned
    assert "resume: make train ARGS=--resume runs/x" in text
    assert "Interrupt" in text and code in (-signal.SIGINT, 130), (code, text)
