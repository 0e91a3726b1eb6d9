"""build_bench_modules.py TREE OUTDIR ARCHIVE [NAME ...]: build the modules that device_run.sh's spec
bench uses (GDN and KDA, fp8 copy, T = 4 and 8, their conventional verifies, the fp8 decode) for
the source tree TREE, leaving out the NAMEs (already carried), and pack them into ARCHIVE."""

import sys
import tarfile
from pathlib import Path


def main(tree: Path, out: Path, archive: Path, leave_out: set[str]) -> int:
    sys.path.insert(0, str(tree))
    import torch

    from replayssm.aot import build_set, out_root
    from replayssm.ops.generators import gdn_decode_spec

    specs = []
    for family in ("gdn", "kda"):
        for T in (4, 8):
            fp8 = torch.float8_e4m3fn
            specs.append(
                gdn_decode_spec("replay_verify", 128, 128, "float32", "bfloat16", 16, family, T, read_dtype=fp8)
            )
            specs.append(gdn_decode_spec("conventional_verify", 128, 128, "float32", "bfloat16", None, family, T))
        specs.append(
            gdn_decode_spec(
                "replay_decode", 128, 128, "float32", "bfloat16", 16, family, read_dtype=torch.float8_e4m3fn
            )
        )
    specs = [s for s in specs if s.name not in leave_out]
    result = build_set(specs, ("90a",), out, None, progress=None)
    root = out_root(out, ("90a",))
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        for s in specs:
            tar.add(root / s.name, arcname=f"{root.name}/{s.name}")
    print(result["built"], "built;", archive, archive.stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]), Path(sys.argv[3]), set(sys.argv[4:])))
