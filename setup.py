"""Build hook: the gRPC modules are generated from ``conductor/wire/*.proto`` when a wheel is built.

They are never committed (``make proto`` generates them in a checkout), so a
wheel built from a clean clone must make them itself, or its client could not
import them. Everything else about the package is declared in pyproject.toml.

One C extension, ``topology.spark._flat`` (the depot source's one-pass msgpack
decoder, ``topology/spark/_flat.c``): optional, so an install where it does not
build (no C compiler) still works, with the numpy decoder. An editable install
(``make``) builds it in place.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

WIRE = Path("conductor") / "wire"


class BuildPyWithProtos(build_py):
    """``build_py``, then ``grpc_tools.protoc`` for every ``.proto`` into the build tree (a build requirement)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install imports the checkout, where `make proto` generated them
        from grpc_tools import protoc

        for proto in sorted(WIRE.glob("*.proto")):
            out = self.build_lib
            args = ["grpc_tools.protoc", "-I.", f"--python_out={out}", f"--grpc_python_out={out}",
                    f"--pyi_out={out}", str(proto)]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed on {proto}; run `make proto` to see its message")


FLAT = Extension("topology.spark._flat", ["topology/spark/_flat.c"], optional=True,
                 extra_compile_args=["-O2", "-std=c99"])

setup(cmdclass={"build_py": BuildPyWithProtos}, ext_modules=[FLAT])
