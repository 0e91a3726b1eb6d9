"""check_modules.py TREE DIR: whether each prebuilt module under DIR/90a matches TREE's sources (the
JIT serves it only then), so that a carried archive is known current before a device call."""

import json
import sys
from pathlib import Path


def main(tree: Path, root: Path) -> int:
    sys.path.insert(0, str(tree))
    from replayssm.jit.build import plan, spec_from_meta

    current = stale = 0
    for meta_file in sorted(root.glob("90a/*/meta.json")):
        meta = json.loads(meta_file.read_text())
        spec = spec_from_meta(meta)
        ok = spec is not None and plan(spec, ("90a",)).src_hash == meta["source_hash"]
        current += ok
        stale += not ok
        if not ok:
            print("stale:", meta["name"])
    print(f"{tree}: {current} current, {stale} stale")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve(), Path(sys.argv[2])))
