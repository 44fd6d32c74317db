"""The ``kcert`` command line: thin doors into the libraries.

:func:`main` imports the commands when it runs, not when this package is
imported: ``kcert serve --workers N`` starts each worker by re-running the
console script (which imports this package) before the worker can answer its
supervisor's health check, and the whole CLI takes seconds to import on a
busy machine.
"""


def main() -> None:
    """Console-script entry point (:func:`kcert.cli.app.main`)."""
    # lazy: a command loads its libraries only when it runs (a fast `kcert --help`)
    from kcert.cli.app import main as run

    run()


__all__ = ["main"]
