"""The ``conductor`` console script: the CLI when ``millrace[server]`` is installed, else how to install it.

``pip install millrace`` is the light app client (no RocksDB, no typer/rich); the
script is still installed, so run without the server extra it says what to
install instead of failing with an ImportError traceback.
"""

from __future__ import annotations

import importlib.util
import sys

#: what the CLI imports beyond the light client (the ``server`` extra of pyproject.toml)
SERVER_MODULES = ("typer", "rich", "rocksdict", "prometheus_client")
INSTALL_HINT = "pip install 'millrace[server]'"


def missing_server_modules() -> list[str]:
    """The server extra's top-level modules this interpreter cannot import."""
    return [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]


def main() -> None:
    """Run the CLI, or exit 1 with one line saying which extra to install."""
    missing = missing_server_modules()
    if missing:
        print(f"error: the conductor CLI needs the server extra (missing: {', '.join(missing)}); "
              f"install it with: {INSTALL_HINT}", file=sys.stderr)
        raise SystemExit(1)
    from conductor.cli import app

    app()
