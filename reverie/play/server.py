"""The web server of ``reverie play``: FastAPI routes over one :class:`PlaySession`, served by uvicorn.

Routes (JSON; every ``/api`` answer is :meth:`PlaySession.snapshot`): ``GET /`` the page (static/, no build step),
``GET /api/state``, ``POST /api/step`` ``{"keys": [...]}`` (held, press order) or ``{"policy": true}``,
``POST /api/reset``, ``POST /api/dream`` (restart the dream), ``POST /api/mode`` ``{"driver", "dream_start"}``.
A refused step answers 409, bad input 422 or 400. The session lives on one thread of its own, serving requests in
turn: an OpenGL simulator (dm_control's EGL) renders, and is freed, only on the thread that made its context.
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
    """The FastAPI app serving the session ``make_session()`` builds on the session's thread before this returns;
    raises what ``make_session`` raises (e.g. ``ValueError`` for a space the page cannot drive)."""
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reverie-play")
    session = thread.submit(make_session).result()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        # close the env on the session's thread: dm_control's exit handler would free it elsewhere (EGL_BAD_ACCESS)
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
    OSError: the port is taken or the host is not an address of this machine."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    return sock


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def serve(app: FastAPI, sock: socket.socket) -> None:
    """Serve ``app`` with uvicorn on ``sock`` until Ctrl-C or SIGTERM, either ending quietly (exit 0): uvicorn raises
    the signal again under the previous handler, which for SIGTERM is set here to raise KeyboardInterrupt (the default
    would exit with -15). Handlers are set on the main thread only."""
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
