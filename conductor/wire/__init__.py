"""What crosses the network: the ``.proto`` files and their generated modules, gRPC options, error mapping.

The ``*_pb2*.py`` modules are generated next to their ``.proto`` files
(``make proto``, or the wheel build), never committed. Keeping them here, and
not in a top-level ``proto`` package, means an installed Millrace claims only
its own top-level names.
"""
