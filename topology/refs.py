"""Functions that travel in hop messages: by name, never pickled.

``ctx.update(pstate, key, plus_one)`` for a key another task group owns sends
a message to that group, and the message must say which function to run
there. It says it by name (``examples.word_count:plus_one``): the module's code
is deployed on every worker, so the name means the same function everywhere,
and a message never carries code. A name is only resolved in a module that
the worker has already imported (the module's own code and what it imports),
so a message can never make a worker import anything.

Only functions defined at the top level of a Python module have such a name.
A lambda or a function defined inside another function has none, and neither
is accepted, wherever the key lives: a module that works with one task group
must work unchanged with eight.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FunctionType
from typing import Any

#: functions already checked (module-level functions live as long as the process)
_REFS: dict[Callable[..., Any], str] = {}
_RESOLVED: dict[str, Callable[..., Any]] = {}
#: what a worker passes as ``on_missing`` to :func:`resolve`: called with the module of a reference this process
#: has not imported, before giving up (the worker imports the code version it belongs to: a hop an older
#: version sent, reaching a worker restarted since the update)
MissingModule = Callable[[str], None]


class UnsendableFunction(ValueError):
    """A function that has no module-level name, so it cannot be sent to another task group."""


def fn_ref(fn: Callable[..., Any], what: str) -> str:
    """``module:qualname`` of a module-level function; :class:`UnsendableFunction` naming the fix otherwise."""
    ref = _REFS.get(fn)
    if ref is not None:
        return ref
    module = getattr(fn, "__module__", None)
    qualname = str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "?"))
    if not callable(fn) or module is None or "<" in qualname or _lookup(module, qualname) is not fn:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise UnsendableFunction(
            f"{what}: {name} ({qualname}) is not a module-level function, so it cannot run on the task group "
            f"that owns the key: define it with `def` at the top level of a module (like plus_one in "
            f"examples/word_count.py) and pass the values it needs as extra arguments, e.g. "
            f"ctx.update(pstate, key, add, 5) with def add(old, n): ...")
    ref = _REFS[fn] = f"{module}:{qualname}"
    return ref


def known_ref(fn: Callable[..., Any]) -> str | None:
    """The reference of a function :func:`fn_ref` accepted before (None: not yet), without building a message."""
    return _REFS.get(fn)


def resolve(ref: str, on_missing: MissingModule | None = None) -> Callable[..., Any]:
    """The function named by ``ref`` (from :func:`fn_ref`); ValueError if this process has no such function.

    ``on_missing`` (the caller's, e.g. a :class:`~topology.stream.StreamRunner`'s) may import the module first.
    """
    known = _RESOLVED.get(ref)
    if known is not None:
        return known
    module, _, qualname = ref.partition(":")
    found = _lookup(module, qualname) if qualname else None
    if found is None and qualname and on_missing is not None:
        on_missing(module)
        found = _lookup(module, qualname)
    if not callable(found):
        raise ValueError(f"function {ref!r} is not defined in this worker's code (is every worker running "
                         "the same module version?)")
    fn: Callable[..., Any] = found
    _RESOLVED[ref] = fn
    return fn


def _lookup(module: str, qualname: str) -> Any:
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


def path_function_ref(fn: Callable[..., Any], what: str) -> str:
    """The wire name of a ``P.filter``/``P.view`` function (pstate.query's ``NameFn``): server-side filters.

    UnsendableFunction (a ValueError) for a lambda or a nested function, saying how to name it.
    """
    try:
        return fn_ref(fn, what)
    except UnsendableFunction:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise UnsendableFunction(
            f"{what} got {name}, which has no module-level name; define it with `def` at the top level of the "
            f"module's code (e.g. `def is_long(pair): return len(pair[0]) > 8` next to the Module class, then "
            f"P.all().filter(is_long)): the worker runs it by that name, never code sent over the network") from None


def module_code_function(ref: str, package: str, alias: str | None = None) -> Callable[..., Any]:
    """The function ``ref`` names, if it is a plain function defined in the module's own code; ValueError otherwise,
    so a client cannot make a worker run a function of the standard library or of the worker by naming it.

    ``package``: the top-level package of the module reference; ``alias``: the package the worker imported the
    module's shipped code under (``topology.code_loader``; None: code from the worker's path). A name the app
    took from its own import of the code (``examples.word_count:is_long``) means the same function there.
    """
    module, _, qualname = ref.partition(":")
    if alias is not None:
        if module.startswith(alias + "."):
            module = module[len(alias) + 1:]
        elif module.split(".")[0] != alias and module.startswith("_millrace_code_"):
            raise ValueError(f"{ref!r} names another code version of the module than the one its data is in; "
                             "the module is being updated: try again")
    if not qualname or not (module == package or module.startswith(package + ".")):
        raise ValueError(f"{ref!r} is not a function of the module's code (package {package!r})")
    loaded = module if alias is None else f"{alias}.{module}"
    fn = resolve(f"{loaded}:{qualname}")
    if not isinstance(fn, FunctionType) or fn.__module__ != loaded:
        raise ValueError(f"{ref!r} is not a function defined in {module}")
    return fn
