"""Build here, without a GPU, the modules that the GPU suite pre-warms, so that a device call does
not spend its time compiling them (about a minute of a whole-suite run on an H100).

    python perf/prebuild_modules.py                    # every GPU test file's modules -> .gl/aot.tar.xz
    python perf/prebuild_modules.py --files test_gdn_decode test_state_formats
    python perf/prebuild_modules.py --list             # the module names only, nothing built
    python perf/prebuild_modules.py --bench-spec "--families kda --drafts 8 16 --trees binary15" \
        --bench-spec "--families gdn --drafts 16 --window 32" --out .gl/aot   # those bench_spec.py runs

Then carry ``.gl/aot.tar.xz`` in the device call: ``perf/device_check.sh`` unpacks it and points
REPLAYSSM_AOT_DIR at it, and says so. The device serves a prebuilt module only when it matches
the sources there (the JIT's source hash), so a stale archive costs its unpacking and nothing
else: whatever differs is compiled on the device as before. Modules are built for 9.0a (the
device's H100 and H200); nvcc and ninja must be on this machine. The archive of every file's
modules is about 29 MB (115 modules, about six minutes on two cores).
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("90a",)


def suite_specs(files: list[str] | None = None) -> dict:
    """{module name: Specialization} of the modules that ``tests/gpu/conftest.py`` pre-warms for
    the named test files (module names such as ``test_gdn_decode``; None: every file)."""
    sys.path.insert(0, str(ROOT))
    from tests.gpu.conftest import _SPECS_BY_FILE

    unknown = sorted(set(files or ()) - set(_SPECS_BY_FILE))
    if unknown:
        raise SystemExit(f"--files: expected test files among {sorted(_SPECS_BY_FILE)}, got {unknown}")
    specs = {}
    for name, make in _SPECS_BY_FILE.items():
        if files is None or name in files:
            for spec in make():
                specs[spec.name] = spec
    return specs


def bench_spec_specs(arguments: str) -> dict:
    """{module name: Specialization} of the modules a perf/bench_spec.py run with these
    arguments (one string, as on its command line) pre-warms."""
    import shlex

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "perf"))
    import bench_spec

    return {spec.name: spec for spec in bench_spec.module_specs(bench_spec.parse_args(shlex.split(arguments)))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="+", default=None, help="test files (e.g. test_gdn_decode); default: all")
    ap.add_argument("--out", type=Path, default=ROOT / ".gl" / "aot", help="build folder (the archive goes beside it)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel nvcc jobs (default: the JIT's bound)")
    ap.add_argument("--list", action="store_true", help="print the module names and build nothing")
    ap.add_argument(
        "--bench-spec",
        metavar="ARGS",
        action="append",
        default=None,
        help="instead of test files: the modules of a perf/bench_spec.py run with these arguments (one string; "
        "repeat it for several runs, one archive)",
    )
    args = ap.parse_args(argv)
    if args.bench_spec is not None and args.files is not None:
        ap.error("--bench-spec and --files: expected one of them, got both")
    if args.bench_spec is None:
        specs = suite_specs(args.files)
    else:
        specs = {name: spec for run in args.bench_spec for name, spec in bench_spec_specs(run).items()}
    if args.list:
        print("\n".join(sorted(specs)))
        return 0
    from replayssm.aot import build_set, out_root

    t0 = time.perf_counter()
    res = build_set(list(specs.values()), ARCHS, args.out, args.jobs, progress=None)
    archive = args.out.with_name(args.out.name + ".tar.xz")
    root = out_root(args.out, ARCHS)
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        for name in sorted(specs):
            tar.add(root / name, arcname=f"{root.name}/{name}")
    print(
        f"{len(res['built'])} built, {len(res['current'])} current, {time.perf_counter() - t0:.0f} s; "
        f"{archive} ({archive.stat().st_size / 2**20:.1f} MiB): carry it"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
