"""MuJoCo's headless OpenGL backend, chosen before dm_control is imported (dm_control fixes it at import).

:func:`select_gl` keeps a ``MUJOCO_GL`` you set, else takes the first of ``egl`` (Debian ``libegl1 libgl1``) and
``osmesa`` (``libosmesa6``) that can create a context, else raises an error naming the packages. dm_control left to
itself takes ``glfw``, which needs a display: every module that imports dm_control calls :func:`select_gl` first.
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
    """No headless OpenGL backend works; the message names the Debian packages to install.

    An ``ImportError`` (a missing system library), so ``reverie train`` reports it at start-up as an env error.
    """


def select_gl(required: bool = True) -> str:
    """Choose MuJoCo's OpenGL backend for this process (and its children) by setting ``MUJOCO_GL``.

    Must run before dm_control is imported (dm_control fixes its backend at import). Keeps a ``MUJOCO_GL``
    that is already set. Otherwise tries ``egl`` then ``osmesa``, each in a short subprocess that creates an
    8x8 context (about a second, once per process: the choice is stored in ``os.environ``).

    Args:
        required: True when images will be rendered. When False and no backend works, ``MUJOCO_GL`` is set
            to ``disable`` (dm_control then never touches OpenGL) instead of raising.

    Returns:
        The backend name now in ``MUJOCO_GL``.

    Raises:
        GLUnavailableError: ``required`` and neither backend works (also when an earlier call in this process
            found none); the message names ``apt-get install libegl1 libgl1`` / ``libosmesa6``.
    """
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
