"""Render -> fingerprint -> (AOT | cache | compile under a file lock) -> load.

Layout of a module directory (same for the JIT cache and AOT output)::

    <root>/<name>/<name>.cu      rendered source (for reading and debugging)
    <root>/<name>/<name>.so      the module: extern "C" entries, no torch/Python symbols
    <root>/<name>/meta.json      written last: name, source_hash, fingerprint, nvcc, archs

A module is served only when ``meta.json`` matches what the current sources, flags and
compiler would produce, so an edited header is never served stale.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from .._version import __version__
from . import env
from .errors import CompileError, MissingModuleError, ToolchainError
from .loader import Module, load_module
from .spec import Specialization, fingerprint, header_digest, render, source_hash

log = logging.getLogger("replayssm.jit")

META = "meta.json"


def compile_flags(archs: tuple[str, ...]) -> list[str]:
    """nvcc flags (no paths): what the fingerprint covers besides sources."""
    return [
        "-std=c++17",
        "-O3",
        "-DNDEBUG",
        "--expt-relaxed-constexpr",
        "-lineinfo",
        "-Xcompiler=-fPIC,-fvisibility=hidden",
        "-shared",
        "-cudart=static",
        *env.gencode_flags(archs),
    ]


@dataclasses.dataclass
class BuildTarget:
    spec: Specialization
    archs: tuple[str, ...]
    source: str
    flags: list[str]
    src_hash: str

    @property
    def name(self) -> str:
        return self.spec.name

    def fingerprint(self, compiler: str) -> str:
        return fingerprint(self.src_hash, compiler)


def plan(spec: Specialization, archs: tuple[str, ...] | None = None, headers: str | None = None) -> BuildTarget:
    archs = env.sort_archs(archs if archs is not None else env.target_archs())
    if not archs:
        raise ToolchainError(
            "replayssm: no CUDA arch to build for: no GPU is visible and REPLAYSSM_CUDA_ARCH_LIST "
            "is not set (e.g. REPLAYSSM_CUDA_ARCH_LIST=9.0a)"
        )
    source = render(spec)
    flags = compile_flags(archs)
    return BuildTarget(spec, archs, source, flags, source_hash(source, flags, headers or header_digest()))


# ----------------------------------------------------------------------------------------
# Module directories
# ----------------------------------------------------------------------------------------


def _read_meta(mod_dir: Path) -> dict | None:
    try:
        return json.loads((mod_dir / META).read_text())
    except (OSError, ValueError):
        return None


def _matches(mod_dir: Path, name: str, src_hash: str, fp: str | None) -> bool:
    meta = _read_meta(mod_dir)
    if not meta or meta.get("name") != name or meta.get("source_hash") != src_hash:
        return False
    if fp is not None and meta.get("fingerprint") != fp:
        return False
    return (mod_dir / f"{name}.so").is_file()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def module_is_current(mod_dir: Path, bp: BuildTarget, compiler: str | None = None) -> bool:
    """``mod_dir`` holds ``bp``'s module built from the same sources and flags (and, when
    ``compiler`` is given, by that compiler version)."""
    return _matches(mod_dir, bp.name, bp.src_hash, bp.fingerprint(compiler) if compiler else None)


def _atomic_write(path: Path, text: str) -> None:
    """Write via a temp file + rename, so readers see the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a shared cache/AOT dir needs 0644
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def publish(build_dir: Path, root: Path, bp: BuildTarget, compiler: str) -> Path:
    """Move a finished build into ``root/<name>/``; meta.json is written last (commit point)."""
    mod_dir = root / bp.name
    mod_dir.mkdir(parents=True, exist_ok=True)
    (mod_dir / META).unlink(missing_ok=True)  # readers treat the module as absent from here
    os.replace(build_dir / f"{bp.name}.so", mod_dir / f"{bp.name}.so")
    _atomic_write(mod_dir / f"{bp.name}.cu", bp.source)
    meta = {
        "name": bp.name,
        "version": __version__,
        "archs": list(bp.archs),
        "source_hash": bp.src_hash,
        "fingerprint": bp.fingerprint(compiler),
        "nvcc": compiler,
        "flags": bp.flags,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "spec": dataclasses.asdict(bp.spec),  # lets `replayssm info` tell current from stale
    }
    _atomic_write(mod_dir / META, json.dumps(meta, indent=1))
    return mod_dir


def spec_from_meta(meta: dict) -> Specialization | None:
    """The Specialization recorded in a module's meta.json (None for foreign or old metadata)."""
    d = meta.get("spec")
    if not isinstance(d, dict):
        return None
    try:
        d = dict(d)
        d["dims"] = tuple((str(k), int(v)) for k, v in d["dims"])
        d["flags"] = tuple(d.get("flags", ()))
        return Specialization(**d)
    except (KeyError, TypeError, ValueError):
        return None


def module_status(mod_dir: Path) -> str:
    """'current', 'stale (...)' or 'incomplete (...)' for a module directory, judged against the
    sources, flags and compiler this process would build with."""
    meta = _read_meta(mod_dir)
    if meta is None:
        return "incomplete (no meta.json: ignored, rebuilt on use)"
    name = meta.get("name", mod_dir.name)
    if not (mod_dir / f"{name}.so").is_file():
        return "incomplete (no .so: ignored, rebuilt on use)"
    spec = spec_from_meta(meta)
    if spec is None or not meta.get("archs"):
        return "unknown (meta.json names no specialization)"
    try:
        bp = plan(spec, tuple(meta["archs"]))
    except Exception as e:  # a template that no longer renders it, a removed generator, ...
        return f"stale (cannot re-plan: {type(e).__name__})"
    if bp.src_hash != meta.get("source_hash"):
        return "stale (sources, headers or flags changed since the build; rebuilt on use)"
    nvcc = env.find_nvcc()
    if nvcc is not None:
        try:
            compiler = env.nvcc_version(str(nvcc))
        except (OSError, subprocess.SubprocessError):
            compiler = None
        if compiler and meta.get("fingerprint") != bp.fingerprint(compiler):
            return f"stale (built by {meta.get('nvcc')}, nvcc is now {compiler}; rebuilt on use)"
    return "current"


# ----------------------------------------------------------------------------------------
# ninja
# ----------------------------------------------------------------------------------------


def _ninja_value(text: str) -> str:
    """A shell-quoted, ninja-escaped variable value (paths may hold spaces or '$')."""
    return shlex.quote(text).replace("$", "$$")


_START = ".start"  # suffix of the stamp file each nvcc edge writes when it starts


def write_ninja(build_dir: Path, plans: list[BuildTarget], nvcc: Path) -> Path:
    """One build.ninja with one nvcc edge per module; sources are written beside it."""
    lines = [
        "ninja_required_version = 1.3",
        f"nvcc = {_ninja_value(str(nvcc))}",
        f"incdir = {_ninja_value(str(env.include_dir()))}",
        "rule nvcc",
        # ': > ${out}.start' (a shell redirect, no extra process) stamps the edge's start time:
        # run_ninja reports each module's compile time from it when ninja says the edge finished.
        f"  command = : > ${{out}}{_START} && $nvcc $flags -I$incdir -o $out $in",
        "  description = nvcc $out",
        "",
    ]
    for bp in plans:
        src = build_dir / f"{bp.name}.cu"
        src.write_text(bp.source)
        lines.append(f"build {bp.name}.so: nvcc {src.name}")
        lines.append(f"  flags = {' '.join(_ninja_value(f) for f in bp.flags)}")
    path = build_dir / "build.ninja"
    path.write_text("\n".join(lines) + "\n")
    return path


#: ninja's status line for a finished edge, with NINJA_STATUS="[%f/%t] " (finished/total edges).
_STATUS_LINE = re.compile(r"^\[(\d+)/(\d+)\] nvcc (\S+)\.so$")

#: ``progress(done, total, name, seconds, ok)``: called as each module's nvcc edge finishes.
Progress = Callable[[int, int, str, float, bool], None]


def run_ninja(build_dir: Path, jobs: int, what: str, progress: Progress | None = None) -> None:
    """Run ninja in ``build_dir``; ``progress`` hears of every finished module as it finishes."""
    ninja = env.find_ninja()
    if ninja is None:
        raise ToolchainError("replayssm: ninja not found (pip install ninja)")
    cmd = [ninja, "-C", str(build_dir), f"-j{jobs}"]
    # Output is a pipe, so ninja prints one status line per edge when it *finishes*.
    child_env = {**os.environ, "NINJA_STATUS": "[%f/%t] "}
    t0 = time.time()
    output: list[str] = []
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=child_env
    ) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            output.append(line)
            m = _STATUS_LINE.match(line.rstrip("\n"))
            if m and progress is not None:
                name = m.group(3)
                out = build_dir / f"{name}.so"
                try:
                    started = (build_dir / f"{name}.so{_START}").stat().st_mtime
                except OSError:
                    started = t0
                progress(int(m.group(1)), int(m.group(2)), name, max(0.0, time.time() - started), out.is_file())
        returncode = proc.wait()
    if returncode != 0:
        raise CompileError(what, " ".join(cmd), "".join(output).strip())


def require_nvcc() -> tuple[Path, str]:
    nvcc = env.find_nvcc()
    if nvcc is None:
        raise ToolchainError(
            "replayssm: nvcc not found (looked in $CUDA_HOME/bin, /usr/local/cuda/bin and PATH); "
            "install the CUDA toolkit or use prebuilt modules (REPLAYSSM_AOT_DIR)"
        )
    return nvcc, env.nvcc_version(str(nvcc))


def check_nvcc_archs(nvcc: Path, compiler: str, archs) -> None:
    """Raise ToolchainError (before anything is created) when this nvcc cannot build an arch."""
    listed = env.nvcc_archs(str(nvcc))
    if listed is None:  # an nvcc that cannot list its archs: let it try
        return
    missing = [a for a in env.sort_archs(archs) if env.split_arch(a)[0] not in listed]
    if missing:
        raise ToolchainError(
            f"replayssm: {nvcc} ({compiler}) cannot build {', '.join(env.arch_label(a) for a in missing)}; it builds "
            f"{', '.join(f'sm_{a}' for a in sorted(listed, key=int) if int(a) >= env.MIN_ARCH)} (of those "
            "replayssm can use). Choose another arch or point CUDA_HOME at a CUDA toolkit that has it"
        )


def _make_dirs(path: Path) -> list[Path]:
    """``mkdir -p path``; returns the folders it created, outermost first."""
    created = []
    p = path
    while not p.exists():
        created.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    return created[::-1]


def _make_build_dir(root: Path) -> Path:
    """A fresh private folder under ``root/.tmp``.

    Another process's cleanup may remove ``.tmp`` (when it looks empty) between our mkdir and
    mkdtemp, so re-create it and retry; once our folder exists, ``.tmp`` is not empty and stays."""
    tmp_root = root / ".tmp"
    for _ in range(100):
        tmp_root.mkdir(parents=True, exist_ok=True)
        try:
            return Path(tempfile.mkdtemp(dir=tmp_root, prefix=f"{os.getpid()}-"))
        except FileNotFoundError:
            continue
    raise OSError(f"replayssm: cannot create a build folder under {tmp_root}: it keeps disappearing")


def compile_into(
    root: Path, plans: list[BuildTarget], jobs: int | None = None, progress: Progress | None = None
) -> list[Path]:
    """Compile ``plans`` in one ninja run and publish them under ``root``. Used by JIT and AOT.

    ``progress(done, total, name, seconds, ok)`` is called as each module finishes compiling.
    Safe to run from many processes at once on one ``root``. Folders created for a build that
    fails are removed again when they are left empty."""
    nvcc, compiler = require_nvcc()
    check_nvcc_archs(nvcc, compiler, {a for bp in plans for a in bp.archs})
    created = _make_dirs(root)
    build_dir = _make_build_dir(root)
    what = plans[0].name if len(plans) == 1 else f"{len(plans)} modules"
    ok = False
    try:
        write_ninja(build_dir, plans, nvcc)
        run_ninja(build_dir, jobs or env.settings().max_jobs, what, progress)
        published = [publish(build_dir, root, bp, compiler) for bp in plans]
        ok = True
        return published
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
        leftovers = [build_dir.parent] + ([] if ok else created[::-1])
        for d in leftovers:  # only when empty: another process may be building beside us
            try:
                d.rmdir()
            except OSError:
                pass


@contextmanager
def file_lock(path: Path):
    """Cross-process exclusive lock (flock: released by the kernel if the holder dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------
# The JIT entry point
# ----------------------------------------------------------------------------------------

_loaded: dict[str, Module] = {}
_loaded_lock = threading.Lock()
_compile_slots: threading.BoundedSemaphore | None = None


_slots_size = 0


def _slots() -> threading.BoundedSemaphore:
    """In-process bound on concurrent compiles (threads); follows ``configure(max_jobs=...)``."""
    global _compile_slots, _slots_size
    with _loaded_lock:
        jobs = env.settings().max_jobs
        if _compile_slots is None or _slots_size != jobs:
            _compile_slots, _slots_size = threading.BoundedSemaphore(jobs), jobs
        return _compile_slots


_warned_aot_dirs: set[Path] = set()  # each missing AOT dir is logged once per process


def _aot_dirs() -> tuple[Path, ...]:
    """The REPLAYSSM_AOT_DIR / ``configure(aot_dirs=...)`` entries (a missing one is logged once)."""
    dirs = env.settings().aot_dirs
    for d in dirs:
        if not d.is_dir() and d not in _warned_aot_dirs:
            _warned_aot_dirs.add(d)
            log.warning(
                "replayssm: AOT dir %s (REPLAYSSM_AOT_DIR / configure(aot_dirs=...)) %s; no prebuilt "
                "modules are found there",
                d,
                "is not a directory" if d.exists() else "does not exist",
            )
    return dirs


def prebuilt_roots(archs: tuple[str, ...]) -> list[Path]:
    """Directories that may hold prebuilt modules for exactly ``archs``, in search order.

    Each REPLAYSSM_AOT_DIR entry is accepted both as the ``--out`` DIR of ``python -m
    replayssm.aot`` (modules under ``DIR/<archs>/``) and as that ``DIR/<archs>`` folder itself;
    then the wheel's ``replayssm/data/aot/<archs>/``."""
    tag = env.arch_tag(archs)
    roots: list[Path] = []
    for d in _aot_dirs():
        roots += [d, d / tag]
    roots += list(_packaged_aot_dirs(archs))
    return roots


def _subfolders(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def aot_folders() -> list[Path]:
    """Every folder that may hold prebuilt modules of any archs, in search order: each AOT dir
    and its subfolders (``DIR`` itself or ``DIR/<archs>``), then the wheel's
    ``replayssm/data/aot/<archs>/`` folders."""
    out: list[Path] = []
    for d in _aot_dirs():
        if d.is_dir():
            out += [d, *_subfolders(d)]
    return out + _subfolders(packaged_aot_root())


def _meta_archs(mod_dir: Path) -> tuple[str, ...] | None:
    """The archs a module's meta.json lists (normalized, oldest first); None when it lists none."""
    meta = _read_meta(mod_dir)
    archs = meta.get("archs") if meta else None
    if not isinstance(archs, list) or not archs:
        return None
    try:
        return env.sort_archs(env.normalize_arch(str(a)) for a in archs)
    except ValueError:
        return None


def _best_prebuilt(bp: BuildTarget, gpus: tuple[str, ...]) -> tuple[Path, tuple[str, ...], tuple[int, int]] | None:
    """The prebuilt module of ``bp.spec``, built for any archs, whose code serves the GPUs of
    archs ``gpus`` best (:func:`replayssm.jit.env.serving_score`: their own arch's cubin, else an
    older minor's cubin of the same major, else PTX of a lower arch; then fewer archs, then search
    order), and which matches the sources and flags this process would build it from for those
    archs. Returns (module dir, its archs, its score) or None."""
    found = []
    for order, folder in enumerate(aot_folders()):
        mod_dir = folder / bp.name
        archs = _meta_archs(mod_dir)
        score = env.serving_score(archs, gpus) if archs else None
        if archs and score is not None:
            found.append((score, len(archs), order, mod_dir, archs))
    headers = None
    for score, _, _, mod_dir, archs in sorted(found, key=lambda f: f[:3]):
        if archs == bp.archs:
            src_hash = bp.src_hash
        else:  # the same source, hashed with the flags of the module's archs
            headers = headers or header_digest()
            src_hash = source_hash(bp.source, compile_flags(archs), headers)
        if _matches(mod_dir, bp.name, src_hash, None):
            return mod_dir, archs, score
    return None


def find_prebuilt(bp: BuildTarget, gpus: tuple[str, ...] | None = None) -> Path | None:
    """An AOT module whose sources and flags match (compiler version is not required).

    ``gpus`` None: one built for exactly ``bp.archs`` (:func:`prebuilt_roots`). ``gpus`` given
    (the archs of the GPUs it must run on): the best module, built for any archs, whose code they
    all run (see :func:`_best_prebuilt`)."""
    if gpus is not None:
        hit = _best_prebuilt(bp, gpus)
        return hit[0] if hit else None
    for root in prebuilt_roots(bp.archs):
        mod_dir = root / bp.name
        if _matches(mod_dir, bp.name, bp.src_hash, None):
            return mod_dir
    return None


def packaged_aot_root() -> Path:
    """Where an AOT wheel carries its modules: ``replayssm/data/aot/`` (then ``<archs>/<name>/``)."""
    return env.PACKAGE_DIR / "data" / "aot"


def _packaged_aot_dirs(archs: tuple[str, ...]) -> tuple[Path, ...]:
    d = packaged_aot_root() / env.arch_tag(archs)
    return (d,) if d.is_dir() else ()


def cached_module_dir(bp: BuildTarget, check_compiler: bool = True) -> Path | None:
    mod_dir = env.cache_dir(bp.archs) / bp.name
    fp = None
    if check_compiler:
        nvcc = env.find_nvcc()
        fp = bp.fingerprint(env.nvcc_version(str(nvcc))) if nvcc else None
    return mod_dir if _matches(mod_dir, bp.name, bp.src_hash, fp) else None


def _existing(bp: BuildTarget, gpus: tuple[str, ...] | None) -> Path | None:
    """A current module for ``bp`` that needs no compile, or None.

    Targets named by the arch list (``gpus`` None): a prebuilt module for exactly those archs,
    else the cache's. Targets that are the visible GPUs (``gpus`` their archs): a prebuilt module
    with their own archs' cubins, else the cache's (JIT-built for their archs), else a prebuilt
    module whose code they run otherwise (an older minor's cubin, or PTX the driver compiles)."""
    if gpus is None:
        return find_prebuilt(bp) or cached_module_dir(bp)
    hit = _best_prebuilt(bp, gpus)
    if hit and hit[2] == (0, 0):
        return hit[0]
    cached = cached_module_dir(bp)
    if cached or not hit:
        return cached
    mod_dir, archs, score = hit
    log.info(
        "replayssm: %s: using the prebuilt module in %s, built for %s, on GPUs of %s%s",
        bp.name,
        mod_dir.parent,
        ", ".join(env.arch_label(a) for a in archs),
        ", ".join(env.arch_label(g) for g in gpus),
        " (the driver JIT-compiles its PTX)" if score[0] == 2 else "",
    )
    return mod_dir


def build(spec: Specialization, archs: tuple[str, ...] | None = None) -> Path:
    """Make sure a current module exists for ``spec``; return its directory. Compiles if needed.

    ``archs`` None builds for the target archs (:func:`replayssm.jit.env.target_archs`); when
    those are the visible GPUs' (no arch list set), a prebuilt module of any archs whose code the
    GPUs run is served too (see :func:`_existing`)."""
    bp = plan(spec, archs)
    s = env.settings()
    gpus = bp.archs if archs is None and not s.arch_list else None
    found = _existing(bp, gpus)
    if found:
        return found
    if s.disable_jit:
        folders = aot_folders() if gpus is not None else prebuilt_roots(bp.archs)
        searched = [str(p) for p in folders] + [str(env.cache_dir(bp.archs))]
        raise MissingModuleError(bp.name, searched)
    root = env.cache_dir(bp.archs)
    with file_lock(root / ".locks" / f"{bp.name}.lock"):
        found = cached_module_dir(bp)  # second check: another process may have built it
        if found:
            return found
        with _slots():
            log.info("replayssm: compiling %s for %s", bp.name, ",".join(env.arch_label(a) for a in bp.archs))
            t0 = time.perf_counter()
            try:
                (mod_dir,) = compile_into(root, [bp], jobs=1)
            except Exception:
                log.info("replayssm: compiling %s failed after %.1f s", bp.name, time.perf_counter() - t0)
                raise
            log.info("replayssm: compiled %s in %.1f s", bp.name, time.perf_counter() - t0)
    return mod_dir


def get_module(spec: Specialization) -> Module:
    """Build (or find) and load the module of ``spec``; cached per process."""
    name = spec.name
    with _loaded_lock:
        mod = _loaded.get(name)
    if mod is not None:
        return mod
    mod_dir = build(spec)
    mod = load_module(mod_dir / f"{name}.so", name)
    with _loaded_lock:
        return _loaded.setdefault(name, mod)
