"""Ahead-of-time build of a declared set of specializations.

    python -m replayssm.aot --arch 9.0a --out DIR [--list] [--jobs N] [--only GLOB] [--force]

Builds :func:`replayssm.ops.generators.aot_specializations` (the model shapes of
``docs/benchmarks.md``) with the generator, renderer and nvcc flags the JIT uses, in one ninja
run bounded by ``--jobs``, logging one line per finished module (``[3/40] NAME 2.1 s``) and the
total. Modules land in the JIT's own layout::

    DIR/<archs>/<name>/<name>.so   DIR/<archs>/<name>/meta.json   DIR/<archs>/<name>/<name>.cu

(``<archs>`` is e.g. ``90a``; ``--arch`` takes the archs the JIT accepts, sm_80 or newer, and an
arch the installed nvcc cannot build is an error before anything is created). Several archs make
one set of fat modules, each holding a cubin per arch, under one folder: ``--arch "8.0+PTX 8.9
9.0a 10.0a"`` gives ``DIR/80+ptx_89_90a_100a/`` (``+PTX`` also embeds that arch's PTX, which
newer GPUs JIT-compile). Each module's meta.json lists its archs. The runtime serves such a module
when its ``source_hash`` matches what it would build itself for those archs (same sources, headers
and flags; the compiler version may differ). With no arch list set, a GPU takes the module with
its own arch's cubin, else an older minor's cubin of its major, else PTX of a lower arch, from any
folder (docs/gpus.md); with REPLAYSSM_CUDA_ARCH_LIST set, only modules built for exactly that
list are served:

* point ``REPLAYSSM_AOT_DIR`` at ``DIR`` (or ``DIR/<archs>``), or
* build into ``replayssm/data/aot`` of a source tree and run ``pip wheel .``: the wheel then
  carries the modules and needs neither nvcc nor a JIT compile for the declared set.

``--list`` prints the names and compiles nothing; ``--render DIR`` writes only the ``.cu``
sources (CMakeLists.txt uses it for its compile checks); ``--set check`` selects the smaller
representative set that CI compiles instead of the AOT set.
"""

from __future__ import annotations

import argparse
import fnmatch
import logging
import sys
import time
from pathlib import Path

from .jit import env
from .jit.errors import JitError

log = logging.getLogger("replayssm.aot")

SETS = ("aot", "check")


def specializations(which: str = "aot", only: list[str] | None = None):
    """The declared set ('aot' or 'check'), filtered by shell-style name patterns."""
    from .ops.generators import aot_specializations, compile_check_specializations

    if which not in SETS:
        raise ValueError(f"set: expected one of {list(SETS)}, got {which!r}")
    specs = aot_specializations() if which == "aot" else compile_check_specializations()
    if only:
        specs = [s for s in specs if any(fnmatch.fnmatchcase(s.name, pat) for pat in only)]
    return specs


def resolve_archs(arch_args: list[str] | None) -> tuple[str, ...]:
    """--arch values ('9.0a', '9.0a,12.0', ...) or the JIT's target archs (env / visible GPUs).

    Raises SettingsError (a ValueError) naming ``--arch`` for an arch replayssm cannot build."""
    if arch_args:
        return env.sort_archs(env.parse_arch_list(arch_args[0] if len(arch_args) == 1 else arch_args, "--arch"))
    return env.target_archs()


def out_root(out: Path, archs: tuple[str, ...]) -> Path:
    """``DIR/<archs>``: the folder that holds one directory per module."""
    return Path(out) / env.arch_tag(archs)


def log_progress(done: int, total: int, name: str, seconds: float, ok: bool) -> None:
    """One INFO line per finished module: ``[3/40] NAME 2.1 s``."""
    log.info("[%d/%d] %s %.1f s%s", done, total, name, seconds, "" if ok else " FAILED")


def build_set(
    specs, archs: tuple[str, ...], out: Path, jobs: int | None = None, force: bool = False, progress=log_progress
) -> dict:
    """Compile what is missing or stale under ``out/<archs>/`` in one ninja run.

    ``progress(done, total, name, seconds, ok)`` hears of each module as it finishes (default:
    :func:`log_progress`; None: silent). Nothing is created when nvcc cannot build ``archs``.
    Returns {'root', 'built', 'current', 'seconds'} (names of modules built / already current)."""
    from .jit.build import check_nvcc_archs, compile_into, module_is_current, plan, require_nvcc

    root = out_root(out, archs)
    plans = [plan(s, archs) for s in specs]
    nvcc, compiler = require_nvcc()
    check_nvcc_archs(nvcc, compiler, archs)
    todo, current = [], []
    for bp in plans:
        if not force and module_is_current(root / bp.name, bp, compiler):
            current.append(bp.name)
        else:
            todo.append(bp)
    t0 = time.perf_counter()
    if todo:
        jobs = jobs or env.settings().max_jobs
        log.info(
            "replayssm.aot: compiling %d module(s) for %s with -j%d into %s",
            len(todo),
            ",".join(env.arch_label(a) for a in archs),
            jobs,
            root,
        )
        compile_into(root, todo, jobs, progress)
        log.info("replayssm.aot: compiled %d module(s) in %.1f s", len(todo), time.perf_counter() - t0)
    return {"root": root, "built": [bp.name for bp in todo], "current": current, "seconds": time.perf_counter() - t0}


def render_set(specs, out: Path) -> list[Path]:
    """Write ``out/<name>.cu`` for every spec (no compile)."""
    from .jit.spec import render

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in specs:
        p = out / f"{s.name}.cu"
        text = render(s)
        if not p.is_file() or p.read_text() != text:  # keep mtimes stable for build systems
            p.write_text(text)
        paths.append(p)
    return paths


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m replayssm.aot",
        description="Build the declared set of replayssm specializations ahead of time.",
        epilog="Use the result with REPLAYSSM_AOT_DIR=DIR, or build into replayssm/data/aot and run "
        "`pip wheel .` for a wheel that carries the modules.",
    )
    p.add_argument(
        "--arch",
        action="append",
        metavar="ARCH",
        help="CUDA arch(s), sm_80 or newer, e.g. 9.0a (Hopper builds sm_90a), 8.0 or 12.0; 8.0+PTX also "
        "embeds compute_80 PTX that newer GPUs JIT-compile; repeat or separate with commas or spaces: "
        "several archs make one module per specialization holding code for each (e.g. "
        "'8.0+PTX 8.9 9.0a 10.0a'). Default: REPLAYSSM_CUDA_ARCH_LIST or the visible GPUs",
    )
    p.add_argument("--out", type=Path, metavar="DIR", help="output directory; modules go to DIR/<archs>/<name>/")
    p.add_argument("--list", action="store_true", help="print the names of the set and exit (no compile)")
    p.add_argument(
        "--jobs",
        "-j",
        type=int,
        metavar="N",
        help="parallel nvcc jobs (default: REPLAYSSM_MAX_JOBS or the machine's bound)",
    )
    p.add_argument("--only", action="append", metavar="GLOB", help="keep only names matching GLOB (repeatable)")
    p.add_argument(
        "--set",
        choices=SETS,
        default="aot",
        dest="which",
        help="'aot': model shapes of docs/benchmarks.md (default); 'check': CI's compile-check set",
    )
    p.add_argument("--force", action="store_true", help="rebuild modules that are already current")
    p.add_argument("--render", type=Path, metavar="DIR", help="only write DIR/<name>.cu for the set (no compile)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        specs = specializations(args.which, args.only)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not specs:
        print(f"error: no specialization of the '{args.which}' set matches --only {args.only}", file=sys.stderr)
        return 2
    if args.list:
        for s in specs:
            print(s.name)
        return 0
    if args.render is not None:
        for path in render_set(specs, args.render):
            print(path)
        return 0
    if args.out is None:
        print("error: --out DIR is required to build (or use --list / --render DIR)", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print(f"error: --jobs: expected a positive integer, got {args.jobs}", file=sys.stderr)
        return 2
    try:
        archs = resolve_archs(args.arch)
        if not archs:
            print(
                "error: no CUDA arch: pass --arch (e.g. --arch 9.0a) or set REPLAYSSM_CUDA_ARCH_LIST; "
                "no GPU is visible",
                file=sys.stderr,
            )
            return 2
        res = build_set(specs, archs, args.out, args.jobs, args.force)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except JitError as e:
        print(str(e), file=sys.stderr)
        return 1
    root = res["root"]
    total = sum(_size(root / n) for n in res["built"] + res["current"])
    print(
        f"{len(res['built'])} built, {len(res['current'])} already current, {total / 2**20:.1f} MiB "
        f"in {root} ({res['seconds']:.1f} s)"
    )
    print(f"use them with: REPLAYSSM_AOT_DIR={Path(args.out).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
