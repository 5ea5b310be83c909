"""The web server of ``reverie play``: FastAPI routes over one :class:`PlaySession`, served by uvicorn.

Routes (JSON bodies; every ``/api`` answer is :meth:`PlaySession.snapshot`)::

    GET  /                 the page (static/index.html + play.js + play.css, no build step)
    GET  /api/state        the current snapshot
    POST /api/step         {"keys": ["ArrowUp", " "]} (held keys, press order) or {"policy": true}
    POST /api/reset        new real episode, dream restarted
    POST /api/dream        restart the dream from the current start mode
    POST /api/mode         {"driver": "person"|"policy", "dream_start": "real"|"initial"}

A step the session refuses (the real episode is over) answers 409; bad input 422 (FastAPI's validation) or 400.
The session is built and used on one thread of its own, which serves the requests one at a time (the session is
one env and one model state): a simulator that renders through OpenGL binds its context to the thread that made
it (dm_control's EGL context: rendering from another thread raises), and FastAPI runs plain routes on a pool of
worker threads. When the server stops (Ctrl-C, SIGTERM) the session's env is closed on that thread too, which frees
such a context where it is current.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any, Callable

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

from reverie.play.session import PlaySession, StepRefused


class StepRequest(BaseModel):
    keys: list[str] = []
    policy: bool = False


class ModeRequest(BaseModel):
    driver: str | None = None
    dream_start: str | None = None


def create_app(make_session: Callable[[], PlaySession], title: str = "reverie play") -> FastAPI:
    """The FastAPI app serving the session ``make_session()`` builds (module docstring).

    ``make_session`` runs on the session's own thread, before this returns.

    Raises:
        what ``make_session`` raises (e.g. ``ValueError`` for a space the page cannot drive).
    """
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reverie-play")
    session = thread.submit(make_session).result()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        # the server is stopping: close the env on the session's thread, where its GL context is current
        # (dm_control's own exit handler would free it from the main thread: EGL_BAD_ACCESS, a traceback at exit)
        await asyncio.wrap_future(thread.submit(session.close))
        thread.shutdown()

    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    static = resources.files("reverie.play") / "static"
    page = (static / "index.html").read_text(encoding="utf-8").replace("{{title}}", title)
    app.mount("/static", StaticFiles(directory=str(static)), name="static")

    async def on_session(change: Callable[[], Any] | None = None) -> dict[str, Any]:
        """Run ``change`` (may raise HTTPException), then answer the snapshot, on the session's thread."""
        def call() -> dict[str, Any]:
            if change is not None:
                change()
            return session.snapshot()
        return await asyncio.wrap_future(thread.submit(call))

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/api/state")
    async def state() -> dict[str, Any]:
        return await on_session()

    @app.post("/api/step")
    async def step(request: StepRequest) -> dict[str, Any]:
        def change() -> None:
            try:
                if request.policy:
                    session.step(session.policy_action())
                else:
                    action = session.keymap.action(request.keys)
                    if action is None:
                        raise HTTPException(400, f"no action is bound to keys {request.keys}")
                    session.step(action)
            except StepRefused as err:
                raise HTTPException(409, str(err)) from err
        return await on_session(change)

    @app.post("/api/reset")
    async def reset() -> dict[str, Any]:
        return await on_session(session.reset)

    @app.post("/api/dream")
    async def dream() -> dict[str, Any]:
        return await on_session(session.restart_dream)

    @app.post("/api/mode")
    async def mode(request: ModeRequest) -> dict[str, Any]:
        def change() -> None:
            try:
                session.set_modes(request.driver, request.dream_start)
            except ValueError as err:
                raise HTTPException(400, str(err)) from err
        return await on_session(change)

    app.state.session = session  # what the routes serve (tests read it)
    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0: a free one), so the address is known before serving.

    Raises:
        OSError: the port is taken or the host is not an address of this machine.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    return sock


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def serve(app: FastAPI, sock: socket.socket) -> None:
    """Serve ``app`` with uvicorn on the bound socket until Ctrl-C or SIGTERM; either ends it quietly (exit 0).

    uvicorn shuts down on both signals and then raises the signal again under the handler that was there before
    it ran: Python's own for Ctrl-C (KeyboardInterrupt), and for SIGTERM the one set here, which does the same
    (the system default would end the process with -15 and no message). On the main thread only, where Python
    allows signal handlers."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        server.run(sockets=[sock])  # returns only once the server has shut down
    except KeyboardInterrupt:  # the Ctrl-C or SIGTERM uvicorn handled and raised again: stop quietly
        pass
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print("[reverie] play: stopped", file=sys.stderr)
