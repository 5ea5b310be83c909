"""MuJoCo's headless OpenGL backend, chosen before dm_control is imported (dm_control fixes it at import; left
to itself it takes ``glfw``, which needs a display). Every module importing dm_control calls :func:`select_gl` first.
"""

from __future__ import annotations

import os
import subprocess
import sys

GL_BACKENDS = {"egl": "libegl1 libgl1", "osmesa": "libosmesa6"}  # MUJOCO_GL value -> Debian packages

_PROBE = (
    "import os, sys; os.environ['MUJOCO_GL'] = sys.argv[1]; "
    "from dm_control import _render; c = _render.Renderer(max_width=8, max_height=8); c.free()"
)
_gl_failures: dict[str, str] = {}


class GLUnavailableError(ImportError):
    """No headless OpenGL backend works; an ``ImportError``, so ``reverie train`` reports it at start-up as an env
    error. The message names the Debian packages."""


def select_gl(required: bool = True) -> str:
    """Set ``MUJOCO_GL`` for this process and its children, keeping one already set; else the first of ``egl``
    (Debian ``libegl1 libgl1``) and ``osmesa`` (``libosmesa6``) that creates an 8x8 context in a subprocess (about a
    second, once per process). Returns the backend name. With no working backend: ``disable`` if not ``required``
    (no images), else GLUnavailableError (also on later calls), naming the ``apt-get install`` command."""
    chosen = os.environ.get("MUJOCO_GL")
    if chosen == "disable" and _gl_failures:  # an earlier call in this process found no backend
        if required:
            raise _gl_error()
        return chosen
    if "dm_control._render" in sys.modules:  # too late to choose: dm_control has fixed its backend at import
        return str(sys.modules["dm_control._render"].BACKEND or chosen or "none")
    if chosen:
        return chosen
    for backend in GL_BACKENDS:
        try:
            done = subprocess.run([sys.executable, "-c", _PROBE, backend], capture_output=True, text=True,
                                  timeout=120)
        except subprocess.TimeoutExpired:
            _gl_failures[backend] = "timed out creating a context"
            continue
        if done.returncode == 0:
            os.environ["MUJOCO_GL"] = backend
            return backend
        lines = [line for line in (done.stderr or "").strip().splitlines() if line.strip()]
        _gl_failures[backend] = lines[-1] if lines else f"exit status {done.returncode}"
    os.environ["MUJOCO_GL"] = "disable"  # dm_control then never touches OpenGL (proprio still works)
    if required:
        raise _gl_error()
    return "disable"


def _gl_error() -> GLUnavailableError:
    detail = "; ".join(f"MUJOCO_GL={b}: {why}" for b, why in _gl_failures.items())
    return GLUnavailableError(
        f"DMC images need headless OpenGL and no backend works ({detail}). Install one: "
        f"`apt-get install -y {GL_BACKENDS['egl']}` (EGL) or `apt-get install -y {GL_BACKENDS['osmesa']}` "
        "(OSMesa, software), or set MUJOCO_GL yourself; proprio-only runs (env=dmc_proprio) need no GL."
    )
