"""Where the JIT finds its sources, compiler and cache, and which GPU archs it builds for.

Every knob has one documented environment variable, read once when the settings are first
used, and one keyword of :func:`configure`, which overrides the variable for this process.
``python -m replayssm info`` prints the values in force, so nothing changes behaviour silently;
a value that cannot be read raises :class:`~replayssm.jit.errors.SettingsError` (a ValueError)
naming the variable or keyword instead of being guessed at.

=========================  ===============  ===============================================
variable                   ``configure``    meaning
=========================  ===============  ===============================================
REPLAYSSM_CACHE_DIR        ``cache_root``   cache root (default ``~/.cache/replayssm``);
                                            modules go under ``<root>/<version>/<archs>/``
REPLAYSSM_CUDA_ARCH_LIST   ``arch_list``    archs to build, sm_80 or newer, e.g. ``"9.0a"``
                                            or ``"8.0 9.0a"`` (default: the visible GPUs;
                                            Hopper becomes ``9.0a``); ``"8.0+PTX"`` also
                                            embeds compute_80 PTX (docs/gpus.md)
REPLAYSSM_DISABLE_JIT      ``disable_jit``  ``1``/``true``/``yes``/``on`` forbid compiling
                                            (a missing module raises
                                            :class:`~replayssm.jit.errors.MissingModuleError`);
                                            ``0``/``false``/``no``/``off`` or empty allow it
REPLAYSSM_MAX_JOBS         ``max_jobs``     bound on parallel nvcc jobs, a positive integer
                                            (default: cores, at most 1 per 3 GiB RAM)
REPLAYSSM_AOT_DIR          ``aot_dirs``     extra directories of prebuilt modules
                                            (``os.pathsep``-separated), searched before the
                                            cache; each is either the ``--out`` DIR of
                                            ``python -m replayssm.aot`` or its
                                            ``<DIR>/<archs>`` subfolder
CUDA_HOME                  (none)           CUDA toolkit root used to find nvcc
=========================  ===============  ===============================================
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import threading
from functools import cache
from pathlib import Path

from .._version import __version__
from .errors import SettingsError, SettingsTypeError

PACKAGE_DIR = Path(__file__).resolve().parent.parent


def source_root() -> Path:
    """Directory holding ``include/`` and ``jit_templates/`` (wheel data dir or the repo)."""
    data = PACKAGE_DIR / "data"
    if (data / "include" / "replayssm").is_dir():
        return data
    return PACKAGE_DIR.parent


def include_dir() -> Path:
    return source_root() / "include"


def templates_dir() -> Path:
    return source_root() / "jit_templates"


@dataclasses.dataclass
class Settings:
    cache_root: Path
    arch_list: tuple[str, ...] | None  # None: detect from the visible GPUs
    disable_jit: bool
    max_jobs: int
    aot_dirs: tuple[Path, ...]


#: The environment variable behind each setting (``Settings`` field = ``configure`` keyword).
ENV_VARS = {
    "cache_root": "REPLAYSSM_CACHE_DIR",
    "arch_list": "REPLAYSSM_CUDA_ARCH_LIST",
    "disable_jit": "REPLAYSSM_DISABLE_JIT",
    "max_jobs": "REPLAYSSM_MAX_JOBS",
    "aot_dirs": "REPLAYSSM_AOT_DIR",
}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _default_max_jobs() -> int:
    cores = os.cpu_count() or 1
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gib = 8.0
    return max(1, min(cores, int(mem_gib // 3)))


def _default_cache_root() -> Path:
    return Path.home() / ".cache" / "replayssm"


def _type_name(value) -> str:
    return type(value).__name__


# ----------------------------------------------------------------------------------------
# Parsers: one per setting, shared by the environment and configure(); ``name`` is the variable
# or keyword the value came from, and every error names it.
# ----------------------------------------------------------------------------------------


def parse_bool(text: str, name: str) -> bool | None:
    """'1'/'true'/'yes'/'on' -> True, '0'/'false'/'no'/'off' -> False (any case), '' -> None."""
    t = text.strip().lower()
    if not t:
        return None
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise SettingsError(
        name, f"{name}: expected 1/0, true/false, yes/no or on/off (any case; empty: unset), got {text!r}"
    )


def parse_jobs(text: str, name: str) -> int | None:
    """A positive integer; '' -> None."""
    if not text.strip():
        return None
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise SettingsError(name, f"{name}: expected a positive integer, got {text!r}")
    return jobs


def parse_arch_list(value, name: str) -> tuple[str, ...]:
    """'9.0a', '9.0a,12.0', '9.0a 12.0', '8.0+PTX 9.0a' or a list/tuple of such strings ->
    ('90a', '120'), ('80+ptx', '90a'), each arch checked with :func:`check_arch` (duplicates
    dropped, order kept; an arch given with and without '+PTX' is kept once, with it)."""
    if isinstance(value, str):
        items = value.replace(",", " ").split()
    elif isinstance(value, (list, tuple)):
        bad = [a for a in value if not isinstance(a, str)]
        if bad:
            raise SettingsTypeError(
                name,
                f"{name}: expected arch strings such as '9.0a', got {bad[0]!r} ({_type_name(bad[0])}) in {value!r}",
            )
        items = [a for text in value for a in text.replace(",", " ").split()]
    else:
        raise SettingsTypeError(
            name,
            f"{name}: expected a string such as '9.0a' or '9.0a,12.0', or a list of "
            f"them, got {value!r} ({_type_name(value)})",
        )
    if not items:
        raise SettingsError(name, f"{name}: expected at least one CUDA arch, e.g. '9.0a', got {value!r}")
    archs: list[str] = []
    for text in items:
        a = check_arch(text, name, value)
        if a not in archs:
            archs.append(a)
    # '8.0 8.0+PTX' is one arch: the '+PTX' build carries the sm_80 cubin too.
    return tuple(a for a in archs if a + PTX_SUFFIX not in archs)


def _parse_path(value, name: str) -> Path:
    if not isinstance(value, (str, os.PathLike)) or isinstance(value, bytes):
        raise SettingsTypeError(
            name, f"{name}: expected a path (str or os.PathLike), got {value!r} ({_type_name(value)})"
        )
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise SettingsError(name, f"{name}: expected a non-empty path, got {value!r}")
    return Path(text).expanduser()


def read_environment(environ=None) -> tuple[Settings, dict[str, SettingsError]]:
    """The settings the environment asks for, and the errors of its unreadable variables (by
    field; an unreadable variable leaves its default in the returned settings)."""
    e = os.environ if environ is None else environ
    errors: dict[str, SettingsError] = {}

    def read(field: str, parse, default):
        var = ENV_VARS[field]
        text = e.get(var, "")
        try:
            value = parse(text, var) if text.strip() else None
        except SettingsError as err:
            errors[field] = err
            value = None
        return default() if value is None else value

    s = Settings(
        cache_root=read("cache_root", lambda t, n: Path(t).expanduser(), _default_cache_root),
        arch_list=read("arch_list", parse_arch_list, lambda: None),
        disable_jit=read("disable_jit", parse_bool, lambda: False),
        max_jobs=read("max_jobs", parse_jobs, _default_max_jobs),
        aot_dirs=read("aot_dirs", lambda t, n: tuple(Path(p).expanduser() for p in t.split(os.pathsep) if p), tuple),
    )
    return s, errors


def _one_error(errors) -> SettingsError:
    errors = list(errors)
    if len(errors) == 1:
        return errors[0]
    return SettingsError(", ".join(e.name for e in errors), "; ".join(str(e) for e in errors))


def _settings_from_env() -> Settings:
    s, errors = read_environment()
    if errors:
        raise _one_error(errors.values())
    return s


_lock = threading.Lock()
_settings: Settings | None = None


def settings() -> Settings:
    """The settings in force (read from the environment on first use).

    Raises :class:`SettingsError` naming every environment variable that cannot be read."""
    global _settings
    with _lock:
        if _settings is None:
            _settings = _settings_from_env()
        return _settings


def settings_and_errors() -> tuple[Settings, dict[str, SettingsError]]:
    """Like :func:`settings`, but never raises: unreadable variables are returned by field (and
    keep their defaults in the settings). For reports such as ``python -m replayssm info``."""
    with _lock:
        if _settings is not None:
            return _settings, {}
    s, errors = read_environment()
    if not errors:
        with _lock:
            return (_settings or s), {}
    return s, errors


_UNSET = object()


def configure(*, cache_root=_UNSET, arch_list=_UNSET, disable_jit=_UNSET, max_jobs=_UNSET, aot_dirs=_UNSET) -> Settings:
    """Override settings for this process; returns the settings now in force.

    Every keyword is optional and overrides its environment variable:

    ``cache_root``  (str or os.PathLike; ``~`` is expanded) the cache root, instead of
                    REPLAYSSM_CACHE_DIR (default ``~/.cache/replayssm``).
    ``arch_list``   the CUDA archs to build, instead of REPLAYSSM_CUDA_ARCH_LIST: a string
                    (``'9.0a'``, ``'9.0a,12.0'`` or ``'9.0a 12.0'``) or a list/tuple of such
                    strings (``['9.0a', 'sm_120']``); sm_80 or newer (the persistent kernel
                    only runs from sm_90 on). ``'8.0+PTX'`` embeds compute_80 PTX beside the
                    sm_80 cubin (the driver JIT-compiles it on newer GPUs). ``None``: build for
                    the visible GPUs (and use any prebuilt module whose code they run).
    ``disable_jit`` ``True`` or ``False`` (a bool), instead of REPLAYSSM_DISABLE_JIT: ``True``
                    never compiles; a missing module raises ``MissingModuleError``.
    ``max_jobs``    an int >= 1, instead of REPLAYSSM_MAX_JOBS: bound on parallel nvcc jobs.
    ``aot_dirs``    a path, or a list/tuple of paths (str or os.PathLike; a single string is one
                    path, not ``os.pathsep``-separated), instead of REPLAYSSM_AOT_DIR;
                    ``None`` or ``()``: none.

    A bad value raises :class:`SettingsError` (a ValueError) naming the keyword, a value of the
    wrong type :class:`SettingsTypeError` (both a TypeError and a SettingsError), an unknown
    keyword TypeError. Nothing changes unless every keyword is valid.

    Example: ``configure(arch_list='9.0a', disable_jit=True)``.
    """
    global _settings
    changes: dict = {}
    if cache_root is not _UNSET:
        changes["cache_root"] = _parse_path(cache_root, "cache_root")
    if arch_list is not _UNSET:
        changes["arch_list"] = None if arch_list is None else parse_arch_list(arch_list, "arch_list")
    if disable_jit is not _UNSET:
        if not isinstance(disable_jit, bool):
            raise SettingsTypeError(
                "disable_jit", f"disable_jit: expected True or False, got {disable_jit!r} ({_type_name(disable_jit)})"
            )
        changes["disable_jit"] = disable_jit
    if max_jobs is not _UNSET:
        if isinstance(max_jobs, bool) or not isinstance(max_jobs, int):
            raise SettingsTypeError(
                "max_jobs", f"max_jobs: expected an int >= 1, got {max_jobs!r} ({_type_name(max_jobs)})"
            )
        if max_jobs < 1:
            raise SettingsError("max_jobs", f"max_jobs: expected an int >= 1, got {max_jobs!r}")
        changes["max_jobs"] = max_jobs
    if aot_dirs is not _UNSET:
        dirs: list | tuple
        if aot_dirs is None:
            dirs = ()
        elif isinstance(aot_dirs, (str, os.PathLike)) and not isinstance(aot_dirs, bytes):
            dirs = (aot_dirs,)
        elif isinstance(aot_dirs, (list, tuple)):
            dirs = aot_dirs
        else:
            raise SettingsTypeError(
                "aot_dirs",
                f"aot_dirs: expected a path or a list/tuple of paths, got {aot_dirs!r} ({_type_name(aot_dirs)})",
            )
        changes["aot_dirs"] = tuple(_parse_path(d, "aot_dirs") for d in dirs)
    with _lock:
        if _settings is None:
            base, errors = read_environment()
            left = [err for field, err in errors.items() if field not in changes]
            if left:  # a bad variable that this call does not override still fails loudly
                raise _one_error(left)
        else:
            base = _settings
        _settings = dataclasses.replace(base, **changes)
        return _settings


# ----------------------------------------------------------------------------------------
# Archs
# ----------------------------------------------------------------------------------------

#: CUDA archs replayssm builds for, as nvcc names them (without the 'a'/'f' suffix). The kernels
#: need sm_80 (cp.async, bf16); the persistent kernels need sm_90 (mbarrier waits, bulk copies)
#: and are a trap in code for older archs, where the plan never picks them. An arch that is not
#: listed here (a newer GPU) is accepted when the installed nvcc lists it.
KNOWN_ARCHS = ("80", "86", "87", "89", "90", "100", "101", "103", "110", "120", "121")
MIN_ARCH = 80

#: Suffix of an arch whose build also embeds its PTX ('8.0+PTX' -> '80+ptx'), as torch's
#: TORCH_CUDA_ARCH_LIST spells it: the driver JIT-compiles that PTX on newer GPUs.
PTX_SUFFIX = "+ptx"


def normalize_arch(arch: str) -> str:
    """'9.0' / '90' / 'sm_90a' / '9.0a' -> '90a' (Hopper always gets its 'a' features);
    '8.0+PTX' -> '80+ptx' (any case).

    Checks the spelling only; :func:`check_arch` also checks that the arch exists."""
    a = arch.strip().lower()
    ptx = a.endswith(PTX_SUFFIX)
    if ptx:
        a = a[: -len(PTX_SUFFIX)].rstrip()
    a = a.removeprefix("sm_").removeprefix("compute_")
    suffix = ""
    if a and a[-1] in "af":
        a, suffix = a[:-1], a[-1]
    digits = a.replace(".", "")
    if not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"CUDA arch: expected e.g. '9.0a', 'sm_90a' or '8.0+PTX', got {arch!r}")
    major = int(digits[:-1])
    if major == 9 or major in (10, 11):
        suffix = suffix or "a"
    return f"{digits}{suffix}{PTX_SUFFIX if ptx else ''}"


def split_arch(arch: str) -> tuple[str, str, bool]:
    """A normalized arch -> (digits, suffix, embeds PTX): '90a' -> ('90', 'a', False),
    '80+ptx' -> ('80', '', True)."""
    ptx = arch.endswith(PTX_SUFFIX)
    a = arch[: -len(PTX_SUFFIX)] if ptx else arch
    if a and a[-1] in "af":
        return a[:-1], a[-1], ptx
    return a, "", ptx


def arch_number(arch: str) -> int:
    """major * 10 + minor of a normalized arch: '90a' -> 90, '80+ptx' -> 80, '121' -> 121."""
    return int(split_arch(arch)[0])


def arch_label(arch: str) -> str:
    """How messages name a normalized arch: '90a' -> 'sm_90a', '80+ptx' -> 'sm_80+PTX'."""
    digits, suffix, ptx = split_arch(arch)
    return f"sm_{digits}{suffix}" + ("+PTX" if ptx else "")


def sort_archs(archs) -> tuple[str, ...]:
    """Normalized archs, oldest first, duplicates dropped: ('100a', '80', '90a') -> ('80', '90a', '100a')."""
    return tuple(sorted(set(archs), key=lambda a: (arch_number(a), a)))


def _known_spellings() -> str:
    return " ".join(f"{a[:-1]}.{a[-1]}" + ("a" if 90 <= int(a) < 120 else "") for a in KNOWN_ARCHS)


def check_arch(text: str, name: str, value=None) -> str:
    """Normalize ``text`` (see :func:`normalize_arch`) and check that replayssm can build it:
    sm_80 or newer, an arch CUDA names (``KNOWN_ARCHS`` or one the installed nvcc lists), with an
    'f' suffix only from sm_100 on, and '+PTX' only on an arch without suffix (PTX of an 'a' or
    'f' arch runs on that arch or family only). Raises :class:`SettingsError` naming ``name``."""
    got = repr(value if value is not None else text)
    expected = (
        f"{name}: expected CUDA archs of sm_{MIN_ARCH} or newer, e.g. '9.0a', '9.0a,12.0' or '8.0+PTX' "
        f"(known: {_known_spellings()}; 'a'/'f' suffixes where CUDA has them; '+PTX' embeds the PTX "
        "of an arch without suffix)"
    )

    def fail(why: str):
        detail = f" ({why})" if why else ""
        return SettingsError(name, f"{expected}, got {got}{detail}")

    try:
        a = normalize_arch(text)
    except ValueError:
        raise fail(f"{text!r} is not a CUDA arch" if value is not None and text != value else "") from None
    base, suffix, ptx = split_arch(a)
    shown = f"sm_{base}{suffix}"
    if int(base) < MIN_ARCH:
        raise fail(f"{shown} is older than sm_{MIN_ARCH}, whose features the kernels use")
    if suffix == "f" and int(base) < 100:
        raise fail(f"{shown} does not exist: 'f' variants start at sm_100")
    if suffix == "a" and int(base) < 90:
        raise fail(f"{shown} does not exist: 'a' variants start at sm_90")
    if ptx and suffix:
        raise fail(
            f"{arch_label(a)}: the PTX of an '{suffix}' arch runs on that {'family' if suffix == 'f' else 'arch'} "
            "only (sm_90, sm_100 and sm_110 are always built as 'a' archs); put +PTX on an arch without "
            "suffix, e.g. 8.0+PTX or 12.0+PTX"
        )
    if base not in KNOWN_ARCHS:
        nvcc = find_nvcc()
        listed = nvcc_archs(str(nvcc)) if nvcc else None
        if not listed or base not in listed:
            raise fail(
                f"{shown} is not a CUDA arch replayssm knows" + (" or the installed nvcc lists" if listed else "")
            )
    return a


def gencode_flags(archs: tuple[str, ...]) -> list[str]:
    """nvcc's -gencode flags: a cubin per arch, and beside it the arch's PTX for a '+ptx' arch."""
    flags = []
    for a in archs:
        digits, suffix, ptx = split_arch(a)
        flags.append(f"-gencode=arch=compute_{digits}{suffix},code=sm_{digits}{suffix}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{digits}{suffix},code=compute_{digits}{suffix}")
    return flags


@cache
def visible_gpu_archs() -> tuple[str, ...]:
    """Archs of the GPUs the driver sees, e.g. ('90a',); () without a driver or a GPU. Asks libcuda
    directly (:mod:`replayssm.jit.driver`): no torch and no CUDA context needed."""
    from .driver import probe

    archs = set()
    for gpu in probe().gpus:
        try:
            archs.add(normalize_arch(gpu.capability))
        except ValueError:  # pragma: no cover - a capability the driver reports oddly
            pass
    return tuple(sorted(archs))


def target_archs() -> tuple[str, ...]:
    """The archs the JIT builds for: the arch list in force, else the visible GPUs' own archs."""
    s = settings()
    if s.arch_list:
        return sort_archs(s.arch_list)
    return sort_archs(visible_gpu_archs())


def arch_tag(archs: tuple[str, ...]) -> str:
    """The folder name of a set of archs: '80_90a', '80+ptx_90a_100a' (oldest first)."""
    return "_".join(sort_archs(archs)) if archs else "noarch"


def cache_dir(archs: tuple[str, ...] | None = None) -> Path:
    """``<root>/<version>/<archs>/`` for the given archs (default: the target archs)."""
    return settings().cache_root / __version__ / arch_tag(archs if archs is not None else target_archs())


# ----------------------------------------------------------------------------------------
# Which prebuilt code a GPU runs
# ----------------------------------------------------------------------------------------


def code_match(arch: str, gpu: str) -> tuple[int, int] | None:
    """How a GPU of arch ``gpu`` (as :func:`visible_gpu_archs` names it, e.g. '86', '90a') runs
    code built for ``arch`` (normalized): ``(0, 0)`` its own arch's cubin; ``(1, d)`` the cubin of
    an arch ``d`` minor versions older of the same major (never an 'a' cubin of another arch);
    ``(2, d)`` PTX of an arch ``d`` below it, which the driver JIT-compiles; None: it cannot. Lower
    is better; among cubins and among PTX the closest arch wins, as the driver chooses."""
    digits, suffix, ptx = split_arch(arch)
    a, g = int(digits), arch_number(gpu)
    if a == g:
        return (0, 0)
    if suffix != "a" and a // 10 == g // 10 and a < g:
        return (1, g - a)
    if ptx and a < g:
        return (2, g - a)
    return None


def serving_score(archs, gpus) -> tuple[int, int] | None:
    """How well a module built for ``archs`` serves every GPU of ``gpus``: the worst over the GPUs
    of the best :func:`code_match` over the module's archs; None when some GPU cannot run it."""
    worst: tuple[int, int] | None = None
    for gpu in gpus:
        best = min((m for m in (code_match(a, gpu) for a in archs) if m is not None), default=None)
        if best is None:
            return None
        worst = best if worst is None else max(worst, best)
    return worst


# ----------------------------------------------------------------------------------------
# Compiler
# ----------------------------------------------------------------------------------------


def find_nvcc() -> Path | None:
    """nvcc from $CUDA_HOME, the standard install folder, then PATH."""
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / "nvcc")
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


@cache
def nvcc_version(nvcc: str) -> str:
    """The last line of ``nvcc --version`` (e.g. 'Build cuda_13.0.r13.0/compiler.36424714_0')."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown"


@cache
def nvcc_archs(nvcc: str) -> frozenset[str] | None:
    """Archs ``nvcc --list-gpu-code`` names, without suffix (e.g. {'90', '100', '120'}); None when
    this nvcc cannot tell (too old for the option, or it does not run)."""
    try:
        proc = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    archs = frozenset(re.findall(r"\bsm_(\d+)[af]?\b", proc.stdout)) if proc.returncode == 0 else frozenset()
    return archs or None


def find_ninja() -> str | None:
    try:
        import ninja

        path = Path(ninja.BIN_DIR) / "ninja"
        if path.is_file():
            return str(path)
    except Exception:
        pass
    return shutil.which("ninja")
