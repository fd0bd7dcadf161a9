"""Types of the C extension built from ``_flat.c`` (FlatDecoder's one-pass kernel); see that file."""

from typing import Any

def decode(buf: Any, bounds: Any, names: Any, name_off: Any, kinds: Any, lo: Any, hi: Any, ivals: Any, fvals: Any,
           soffs: Any, chars: Any, valid: Any, counts: Any) -> bool: ...
