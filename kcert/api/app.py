"""The registry's HTTP API (v1): a thin FastAPI door into :mod:`kcert.registry`.

:func:`create_app` builds an application around one database: it migrates the
database to head on start (the schema comes only from Alembic), wires the
problem+json handlers, caps and checks request bodies and mounts the routers, including
the audit log's public routes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy import Engine

from kcert import __version__
from kcert.api import (
    openapi,
    routes_certificates,
    routes_health,
    routes_log,
    routes_observations,
    routes_targets,
    routes_tokens,
)
from kcert.api.body import JsonBodyMiddleware
from kcert.api.problems import (
    EXCEPTION_HANDLERS,
    BodyLimitMiddleware,
    HeadLimitMiddleware,
    LastResortMiddleware,
)
from kcert.registry.audit import log_signer
from kcert.registry.checkpoints import CheckpointGuard, CheckpointPublisher, witness_endpoints
from kcert.registry.config import Settings
from kcert.registry.db import engine_for, migrate
from kcert.registry.gatekeeper import Gatekeeper

log = logging.getLogger("kcert.log")

def create_app(
    settings: Settings | None = None, *, engine: Engine | None = None, migrate_on_start: bool = True
) -> FastAPI:
    """An API over ``engine`` (default: the database ``settings`` name)."""
    settings = settings or Settings()
    engine = engine or engine_for(settings.resolved_database_url())
    if migrate_on_start:
        migrate(engine)

    app = FastAPI(
        title="kcert registry",
        version=__version__,
        description="Certificates of GPU kernels, trusted keys, targets, promotions and the gate.",
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    # The last signed checkpoint guards the log against a restored or forked database.
    guard = CheckpointGuard(
        settings.home, log_signer(settings.home), witnesses=witness_endpoints(settings.witnesses),
        witness_timeout=settings.witness_timeout,
    )  # fmt: skip
    guard.startup(engine)
    if engine.dialect.name == "postgresql" and not guard.witnesses:
        # Replicas on several hosts with a home each could sign forks; only a witness sees it.
        log.warning(
            "serving PostgreSQL without witnesses (KCERT_WITNESSES): every replica must use "
            "the same KCERT_HOME (one log-checkpoint), or a rolled-back database can be "
            "signed as a fork by a replica with an older checkpoint file"
        )
    app.state.log_guard = guard
    app.state.checkpoint_publisher = CheckpointPublisher(
        guard, engine, settings.checkpoint_interval
    )
    admin = settings.admin_token.get_secret_value() if settings.admin_token else None
    # Per app (so per process): cached gate answers, checked against the database's version.
    app.state.gatekeeper = Gatekeeper(
        engine, admin_token=admin, render=routes_targets.render_gate, health=guard
    )
    for exc_class, handler in EXCEPTION_HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
    app.include_router(routes_targets.gate_router, tags=["targets"])
    app.include_router(routes_certificates.router, tags=["certificates"])
    app.include_router(routes_targets.router, tags=["targets"])
    app.include_router(routes_tokens.router, tags=["tokens"])
    app.include_router(routes_observations.router, tags=["observations"])
    app.include_router(routes_health.router, tags=["log"])
    app.include_router(routes_log.router, tags=["log"])
    openapi.install(app)
    # Added last, so outermost: the cap applies before routing and before the body checks
    # (UTF-8 JSON, depth, NUL), the last resort around all.
    app.add_middleware(JsonBodyMiddleware)
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes,
        per_path={"/v1/observations": settings.observation_max_body_bytes},
    )  # fmt: skip
    app.add_middleware(HeadLimitMiddleware)
    app.add_middleware(LastResortMiddleware)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.checkpoint_publisher.start()
    yield
    app.state.checkpoint_publisher.stop()
    app.state.gatekeeper.close()
    app.state.log_guard.close()

