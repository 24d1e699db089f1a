"""Fast access to pynvml's ctypes structs.

pynvml's structs decode bytes in Python-level attribute hooks on every access, which makes
reading and filling them field by field several times slower than plain ctypes. A view through a
plain structure with the same fields onto the same memory reads and writes numbers at ctypes
speed; the sampler reads field values and GPM results through such views, and the simulator
builds its answers through them.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def plain_layout(struct_type: type[ctypes.Structure]) -> type[ctypes.Structure]:
    """A ctypes structure with the fields of one of pynvml's structs but without its hooks."""
    fields = struct_type._fields_
    return type(f"Plain{struct_type.__name__}", (ctypes.Structure,), {"_fields_": fields})


def filled(struct_type: type[ctypes.Structure], **values: Any) -> Any:
    """One of pynvml's structs with these fields set, filled through its plain layout."""
    return struct_type.from_buffer_copy(plain_layout(struct_type)(**values))
