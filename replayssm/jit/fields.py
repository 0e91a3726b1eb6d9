"""Field tables of ctypes mirrors of the modules' params structs: (dotted C++ name, offset, size) of
every leaf field, as each module's replayssm_params_field lists them (common/fields.h), so the
loader can compare a mirror with the compiled struct field by field."""

from __future__ import annotations

import ctypes

#: C++ field names that Python spells differently (``in`` is a Python keyword).
CXX_FIELD_NAMES = {"inputs": "in"}


def field_table(struct_type) -> list[tuple[str, int, int]]:
    """(dotted C++ name, offset, size) of every leaf field of a ctypes Structure, recursively through
    nested structures and arrays of structures, as replayssm_params_field lists them."""
    out: list[tuple[str, int, int]] = []

    def walk(t, prefix: str, base: int) -> None:
        for f in t._fields_:
            name, ftype = f[0], f[1]
            desc = getattr(t, name)
            path = prefix + CXX_FIELD_NAMES.get(name, name)
            at = base + desc.offset
            if isinstance(ftype, type) and issubclass(ftype, ctypes.Structure):
                walk(ftype, path + ".", at)
            elif (
                isinstance(ftype, type)
                and issubclass(ftype, ctypes.Array)
                and isinstance(ftype._type_, type)
                and issubclass(ftype._type_, ctypes.Structure)
            ):
                esz = ctypes.sizeof(ftype._type_)
                for i in range(ctypes.sizeof(ftype) // esz):  # the array's length
                    walk(ftype._type_, f"{path}[{i}].", at + i * esz)
            else:
                out.append((path, at, ctypes.sizeof(ftype)))

    walk(struct_type, "", 0)
    return out
