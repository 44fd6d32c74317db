"""Serving the registry in production: uvicorn, N worker processes, TCP_NODELAY kept.

``uvicorn --workers N`` (0.54) binds its shared listening socket with
``proto`` 0; the sockets it accepts inherit that, and asyncio sets
TCP_NODELAY only on sockets whose ``proto`` is IPPROTO_TCP. Without it every
keep-alive request after the first waits about 40 ms for a delayed ACK
(Kludex/uvicorn#3149). :func:`serve` binds the socket itself with
IPPROTO_TCP and hands it to uvicorn's own supervisor, which is the whole fix.
``kcert serve`` and ``bench/gate.py`` both serve through this function, so the
bench measures what users run.

The app is built in each worker by the factory named in ``app`` (default
:func:`serving_app`: :func:`kcert.api.app.create_app`, which reads its
settings from the environment, then its start-up heap frozen), so each worker
has its own engine, pool and gate cache; the gate cache stays correct across
workers through the registry's version (see :mod:`kcert.registry.gatekeeper`).
Requests are parsed by h11 on uvloop. h11 caps the request head through
uvicorn's own setting (``h11_max_incomplete_event_size``,
:data:`MAX_REQUEST_HEAD_BYTES`); httptools is faster but buffers a request
head of any size, and capping it needs uvicorn's private protocol classes.

Worker start-up. uvicorn's supervisor pings each worker from the moment it
spawns it and kills one that does not answer within
``timeout_worker_healthcheck`` (5 s); a worker starts answering only once
its interpreter is up and it has unpickled its config and re-run the parent's
``__main__`` script. Everything heavy therefore comes after that: the HTTP
protocol is named by its string (a class would be imported while the
config is unpickled), the console script imports the CLI only when it runs
(:mod:`kcert.cli`), and the database is migrated once, by the caller of
:func:`serve`, before any worker starts, never by a worker.
"""

from __future__ import annotations

import gc
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

#: The registry's app factory, as uvicorn imports it in every worker.
APP_FACTORY = "kcert.api.serve:serving_app"


def serving_app() -> FastAPI:
    """:func:`kcert.api.app.create_app` for a long-running server process (what uvicorn calls).

    It does not migrate: whoever starts the server has (``kcert serve`` does, once,
    before the workers start), so workers neither race on it nor spend their start-up on it.
    """
    # lazy: the app (and the whole registry) loads in the serving process only
    from kcert.api.app import create_app

    app = create_app(migrate_on_start=False)
    freeze_startup_heap()
    return app


#: Bytes a request's line and headers may take together. h11 cuts off a head still arriving
#: past it with a 400 (uvicorn's h11 default is 16 KiB), and the app answers a complete one
#: over it with a 431 (:class:`kcert.api.problems.HeadLimitMiddleware`).
MAX_REQUEST_HEAD_BYTES = 32 * 1024


def freeze_startup_heap() -> None:
    """Keep what start-up made out of the garbage collector's full scans (:func:`gc.freeze`).

    A registry worker starts with about 120,000 tracked objects (FastAPI,
    pydantic, SQLAlchemy, the routes) that live as long as the process. Each
    full collection rescanned them all, about 33 ms on a development machine,
    and under load (the gate cache's new entries survive) full collections come
    every few seconds, each a pause for every request in flight. Collecting
    first frees start-up's garbage instead of freezing it.
    """
    gc.collect()
    gc.freeze()


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket whose accepted connections get TCP_NODELAY from asyncio."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )[0]
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.set_inheritable(True)
    return sock


def serve(
    *, host: str = "127.0.0.1", port: int = 8700, workers: int = 1, access_log: bool = False,
    app: str = APP_FACTORY, app_dir: str | None = None, log_level: str = "warning",
) -> None:  # fmt: skip
    """Run ``app`` (a factory's import string) until interrupted.

    One worker runs in this process; more run under uvicorn's supervisor
    (which restarts a worker that dies) over one shared socket. No access log
    by default: it costs a log line per gate request and says nothing the
    audit log does not.
    """
    # lazy: only serving needs the web server
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    if app_dir:
        sys.path.insert(0, app_dir)
    config = uvicorn.Config(
        app, factory=True, host=host, port=port, workers=workers, access_log=access_log,
        log_level=log_level, http="h11", h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES,
    )  # fmt: skip
    if workers <= 1:
        uvicorn.Server(config).run()
        return
    sock = listening_socket(host, port)
    try:
        Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()
