"""kcert.registry: the content-addressed certificate registry, as a library.

- ``models``: the tables and the API's request/response models (one family per table);
- ``policy``: the pure promotion policy (``decide_promotion``, ``decide_gate``);
- ``decisions``: promotions and the gate (gather recorded inputs, decide, log);
- ``certificates``, ``keys``, ``targets``, ``tokens``: the stores;
- ``db``: engines, sessions and Alembic migrations; ``config``: ``Settings``;
  ``envvars``: the ``KCERT_*`` variables' names and defaults, and a client's light reader;
- ``client``: one interface to an embedded or a remote registry;
- ``audit``/``log_models``: the audit log (written in the same transaction as each change).

Nothing here imports FastAPI, Typer or ``kcert.api``/``kcert.cli``.
"""
