"""What code a compiled module carries: the entries of the CUDA fat binaries embedded in a .so.

Reads the container nvcc embeds (no cuobjdump needed, which some toolkits lack): a fat binary is
a header (magic 0xBA55ED50, u16 version, u16 header size, u64 size of the entries) followed by
entries, each a header (u16 kind: 1 PTX, 2 cubin; u16 version; u32 header size; u32 padded
payload size; ...; u32 at offset 28: the arch as major * 10 + minor; ...) and its payload. PTX
payloads are usually compressed, so only kinds and archs are read, never the code.
"""

from __future__ import annotations

import struct
from pathlib import Path

_MAGIC = struct.pack("<I", 0xBA55ED50)
KINDS = {1: "ptx", 2: "cubin"}


def fatbin_entries(so: Path) -> set[tuple[str, int]]:
    """{(kind, arch)} over every fat binary in ``so``: ('cubin', 90) for sm_90/sm_90a code,
    ('ptx', 80) for compute_80 PTX. Raises ValueError when the file holds no fat binary."""
    data = Path(so).read_bytes()
    out: set[tuple[str, int]] = set()
    pos = data.find(_MAGIC)
    if pos < 0:
        raise ValueError(f"{so}: no CUDA fat binary found")
    while pos >= 0:
        _magic, _version, header, size = struct.unpack_from("<IHHQ", data, pos)
        p, end = pos + header, pos + header + size
        while p < end:
            kind, _ev, entry_header, padded = struct.unpack_from("<HHII", data, p)
            (arch,) = struct.unpack_from("<I", data, p + 28)
            out.add((KINDS.get(kind, f"kind{kind}"), arch))
            if entry_header == 0:  # not a well-formed entry: stop rather than loop
                break
            p += entry_header + padded
        pos = data.find(_MAGIC, end)
    return out
