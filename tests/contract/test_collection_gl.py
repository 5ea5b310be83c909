"""Collecting the test suite must not import dm_control's renderer.

dm_control fixes its OpenGL backend when ``dm_control._render`` is first imported and, with ``MUJOCO_GL`` unset,
takes glfw, which cannot open a context on a headless machine. A test module that imported ``dm_control.suite`` at
collection did that in every pytest-xdist worker, before :func:`reverie.envs.gl.select_gl` ran, and every later
pixel test in that worker failed with "an OpenGL platform library has not been loaded" (CI, stop 49)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import os, sys, pytest
code = pytest.main(['--collect-only', '-q', '-p', 'no:xdist', '-p', 'no:cacheprovider', 'tests'])
print('RENDER_IMPORTED', 'dm_control._render' in sys.modules, 'EXIT', int(code))
"""


def test_collecting_the_suite_leaves_dm_controls_gl_backend_unchosen():
    env = {k: v for k, v in os.environ.items() if k != "MUJOCO_GL"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    last = done.stdout.strip().splitlines()[-1]
    assert last.endswith("EXIT 0"), done.stdout[-2000:] + done.stderr[-2000:]
    assert last.startswith("RENDER_IMPORTED False"), (
        "a test module imports dm_control's renderer at collection (before select_gl): import dm_control inside "
        "the test, after reverie.envs.gl.select_gl()")
