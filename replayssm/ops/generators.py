"""One generator per op: the Specialization that JIT, AOT and the tests' pre-warm all build.

Each generator validates its arguments against what the kernels support, so an unsupported
configuration fails here with a clear message instead of as a template error in nvcc.
"""

from __future__ import annotations

from ..jit.constants import MAX_DRAFTS as _MAX_DRAFTS
from ..jit.spec import READ_CODES, Specialization, dtype_code

MAMBA2_P = (64, 80, 128)
MAMBA2_N = (64, 128, 256)
WINDOWS = (8, 16, 32)


def check_choice(arg: str, value, allowed) -> None:
    """ValueError naming ``arg`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{arg}: expected one of {list(allowed)}, got {value!r}")


DECODE_OPS = ("replay_decode", "conventional_decode", "replay_verify", "conventional_verify")
#: Ops of a family's modules: the decode ops and ``materialize`` (prefix states of many layers).
MODULE_OPS = (*DECODE_OPS, "materialize")
#: Compiled draft capacities of the verify ops; a plan for T drafts uses the smallest >= T.
VERIFY_T = (2, 4, 8, 16)
#: Most drafts per row (kMaxDrafts in include/replayssm/common/constants.h).
MAX_DRAFTS = _MAX_DRAFTS
assert VERIFY_T[-1] == MAX_DRAFTS, "the largest compiled draft capacity is kMaxDrafts"

GDN_DIMS = (64, 128, 256)


def verify_capacity(T: int) -> int:
    """The compiled draft capacity (a VERIFY_T value) that serves a plan of T drafts (1..16)."""
    if isinstance(T, bool) or not isinstance(T, int) or not 1 <= T <= MAX_DRAFTS:
        raise ValueError(f"draft_len (T): expected an int in [1, {MAX_DRAFTS}], got {T!r}")
    return next(t for t in VERIFY_T if t >= T)


def _decode_spec(
    family: str,
    template: str,
    op: str,
    dims: tuple[tuple[str, int], ...],
    state_dtype,
    io_dtype,
    L: int | None,
    T: int = 1,
    read: str | None = None,
    flags: tuple[str, ...] = (),
) -> Specialization:
    """The part every decode generator shares: op, window and draft-capacity checks, dtype codes.
    Decode ops have T = 1; verify ops T in VERIFY_T (their draft capacity)."""
    check_choice("op", op, MODULE_OPS)
    if op.startswith("replay"):
        check_choice("L (window)", L, WINDOWS)
    else:
        L = None
    if op.endswith("verify"):
        check_choice("T (draft capacity)", T, VERIFY_T)
    else:
        check_choice("T (tokens per row)", T, (1,))
    return Specialization(
        family=family,
        op=op,
        template=template,
        dims=dims,
        state_dtype=dtype_code(state_dtype),
        io_dtype=dtype_code(io_dtype),
        L=L,
        T=T,
        read=read,
        flags=flags,
    )


#: Read-copy formats the kernels have (replayssm.reference.quant names), per family.
READ_FORMATS = {
    "mamba2": ("float8_e4m3fn", "bfloat16", "nvfp4"),
    "gdn": ("float8_e4m3fn", "bfloat16", "nvfp4"),
    "kda": ("float8_e4m3fn", "bfloat16", "nvfp4"),
}
#: The state rows (cols) the scaled read copies need: fp8 rows of at least FP8_MIN_COLS elements;
#: NVFP4 rows of a multiple of NVFP4_COLS_MULTIPLE (blocks of 16 values; whole 128-value groups
#: keep every packed row, cols * 9 / 16 bytes, 8-byte aligned).
FP8_MIN_COLS = 128
NVFP4_COLS_MULTIPLE = 128


def read_format_name(read_dtype) -> str | None:
    """A read_dtype argument (None, torch.float8_e4m3fn, torch.bfloat16 or their names, or the
    string 'nvfp4', which has no torch dtype) -> the format name ('float8_e4m3fn', 'bfloat16',
    'nvfp4') or None. Raises TypeError/ValueError otherwise."""
    if read_dtype is None:
        return None
    text = str(read_dtype).removeprefix("torch.") if not isinstance(read_dtype, bool) else None
    if text in READ_CODES:
        return text
    if isinstance(read_dtype, str) or hasattr(read_dtype, "is_floating_point"):
        raise ValueError(
            "read_dtype: expected None, torch.float8_e4m3fn or torch.bfloat16 (or their names) or 'nvfp4', "
            f"got {read_dtype!r}"
        )
    raise TypeError(f"read_dtype: expected None, a torch.dtype, its name or 'nvfp4', got {type(read_dtype).__name__}")


def _flag(arg: str, v) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{arg}: expected a bool, got {type(v).__name__} {v!r}")
    return v


#: How messages name the families.
FAMILY_NAMES = {"mamba2": "Mamba-2", "gdn": "GDN", "kda": "KDA"}


def check_state_format(
    family: str,
    op: str,
    read: str | None,
    state_dtype,
    cols: int,
    single_copy: bool = False,
    stochastic_rounding: bool = False,
) -> tuple[str | None, tuple[str, ...]]:
    """The state format of a module of ``family``/``op`` whose state rows have ``cols`` elements:
    (the read copy's short code or None, the format flags of its name). ValueError/TypeError where
    the kernels have no such format (docs/design.md, "State formats"):

    * a read copy (``read``): fp8, NVFP4 or bf16 beside a float32 checkpoint, or fp8 or NVFP4
      beside a bfloat16 / float16 one (a copy is narrower than its checkpoint); fp8 needs rows of
      >= 128 elements, NVFP4 rows of a multiple of 128;
    * ``single_copy``: the fp8 copy is the only state (read = 'float8_e4m3fn'; state_dtype names
      the arithmetic and must be float32); an NVFP4 copy always sits beside a checkpoint;
    * ``stochastic_rounding``: the flush rounds a bfloat16 checkpoint (alone or beside an fp8 or
      NVFP4 copy, which is encoded to nearest) or the single fp8 copy stochastically;
    * each of them serves the replay decode step; the verify (every family) takes a read copy
      beside a float32 checkpoint (no single copy, no stochastic rounding there yet)."""
    single, sr = _flag("single_copy", single_copy), _flag("stochastic_rounding", stochastic_rounding)
    state = dtype_code(state_dtype)
    if read is None and not single and not sr:
        return None, ()
    if read is not None and read not in READ_FORMATS[family]:
        raise ValueError(
            f"read_dtype: {family} kernels have read copies {list(READ_FORMATS[family]) or 'none yet'}, got {read!r}"
        )
    what = "read_dtype" if read is not None else ("single_copy" if single else "stochastic_rounding")
    if op == "replay_verify" and (single or sr or state != "f32"):
        bad = "single_copy" if single else ("stochastic_rounding" if sr else "state_dtype")
        raise ValueError(
            f"{bad}: the {FAMILY_NAMES[family]} verify reads a read copy beside a float32 checkpoint only so far "
            f"(no single copy, no stochastic rounding, no 16-bit checkpoint); got read_dtype {read!r}, state_dtype "
            f"{state_dtype!r}, single_copy={single}, stochastic_rounding={sr}"
        )
    elif op not in ("replay_decode", "replay_verify"):
        raise ValueError(
            f"{what}: only the replay decode step and the replay verify have read copies, single copies and "
            f"stochastic rounding so far (op {op!r}: the conventional algorithm reads and writes the checkpoint itself)"
        )
    if single:
        if read == "nvfp4":
            raise ValueError(
                "single_copy: the single-copy state is fp8 (read_dtype=torch.float8_e4m3fn); an nvfp4 read copy "
                "needs a checkpoint beside it (single_copy=False), got read_dtype 'nvfp4'"
            )
        if read != "float8_e4m3fn":
            raise ValueError(
                f"single_copy: the single-copy state is fp8 (read_dtype=torch.float8_e4m3fn), got read_dtype {read!r}"
            )
        if state != "f32":
            raise ValueError(
                "single_copy: the fp8 copy is the only state (state_dtype names its arithmetic and must be "
                f"float32), got state_dtype {state_dtype!r}"
            )
    elif read is not None and state != "f32" and read not in ("float8_e4m3fn", "nvfp4"):
        raise ValueError(
            "read_dtype: a read copy is narrower than its checkpoint: float8_e4m3fn, nvfp4 or bfloat16 beside a "
            "float32 checkpoint, float8_e4m3fn or nvfp4 beside a 16-bit one; got read_dtype "
            f"{read!r} with state_dtype {state_dtype!r}"
        )
    if sr and not single and state != "bf16":
        raise ValueError(
            "stochastic_rounding: the flush rounds a bfloat16 checkpoint (alone or beside an fp8 or nvfp4 read copy) "
            f"or the single fp8 copy stochastically; got state_dtype {state_dtype!r}"
            + (f" with read_dtype {read!r}" if read is not None else "")
        )
    if read == "float8_e4m3fn" and cols < FP8_MIN_COLS:
        raise ValueError(
            f"read_dtype: the fp8 read copy needs state rows of at least {FP8_MIN_COLS} elements, got {cols}"
        )
    if read == "nvfp4" and cols % NVFP4_COLS_MULTIPLE:
        raise ValueError(
            f"read_dtype: the nvfp4 read copy needs state rows whose length is a multiple of {NVFP4_COLS_MULTIPLE} "
            f"elements, got {cols}"
        )
    flags = tuple(f for f, on in (("single", single), ("sr", sr)) if on)
    return (READ_CODES[read] if read is not None else None), flags


def mamba2_decode_spec(
    op: str,
    P: int,
    N: int,
    state_dtype,
    io_dtype,
    L: int | None = None,
    T: int = 1,
    read_dtype=None,
    single_copy: bool = False,
    stochastic_rounding: bool = False,
) -> Specialization:
    """Specialization of a Mamba-2 decode or verify module.

    op: 'replay_decode', 'replay_verify' (need L), 'conventional_decode' or 'conventional_verify';
    P in MAMBA2_P; N in MAMBA2_N; state_dtype, io_dtype in {float32, bfloat16, float16}; L in
    WINDOWS; T: 1 for decode ops, the draft capacity (VERIFY_T) for verify ops; read_dtype: None
    or the low-precision read copy (torch.float8_e4m3fn needs N >= 128, 'nvfp4' N % 128 == 0,
    torch.bfloat16); single_copy, stochastic_rounding: the state format (check_state_format;
    the verify: a read copy beside a float32 checkpoint).
    """
    check_choice("op", op, MODULE_OPS)
    check_choice("P (head dim)", P, MAMBA2_P)
    check_choice("N (state dim)", N, MAMBA2_N)
    read, flags = check_state_format(
        "mamba2", op, read_format_name(read_dtype), state_dtype, N, single_copy, stochastic_rounding
    )
    dims = (("P", P), ("N", N))
    return _decode_spec("mamba2", "mamba2_decode.cu.jinja", op, dims, state_dtype, io_dtype, L, T, read, flags)


def gdn_decode_spec(
    op: str,
    K: int,
    V: int,
    state_dtype,
    io_dtype,
    L: int | None = None,
    family: str = "gdn",
    T: int = 1,
    read_dtype=None,
    single_copy: bool = False,
    stochastic_rounding: bool = False,
) -> Specialization:
    """Specialization of a Gated DeltaNet (family 'gdn') or KDA (family 'kda', per-channel decay)
    decode module.

    op: 'replay_decode', 'replay_verify' (need L), 'conventional_decode' or 'conventional_verify';
    K, V (key and value head dims) in GDN_DIMS; state_dtype, io_dtype in {float32, bfloat16, float16};
    L in WINDOWS; T: 1 for decode ops, the draft capacity (VERIFY_T) for verify ops; read_dtype: None
    or the low-precision read copy of the checkpoint's (hv, v) rows over K (torch.float8_e4m3fn
    needs K >= 128, 'nvfp4' K % 128 == 0, torch.bfloat16); single_copy, stochastic_rounding: the
    state format (check_state_format; the verify: a read copy beside a float32 checkpoint)."""
    check_choice("family", family, ("gdn", "kda"))
    check_choice("op", op, MODULE_OPS)
    check_choice("K (key head dim)", K, GDN_DIMS)
    check_choice("V (value head dim)", V, GDN_DIMS)
    read, flags = check_state_format(
        family, op, read_format_name(read_dtype), state_dtype, K, single_copy, stochastic_rounding
    )
    dims = (("K", K), ("V", V))
    return _decode_spec(family, "gdn_decode.cu.jinja", op, dims, state_dtype, io_dtype, L, T, read, flags)


#: Draft capacities the AOT set carries for speculative decoding (a plan of T <= 8 drafts).
AOT_VERIFY_T = (4, 8)


def aot_specializations() -> list[Specialization]:
    """The declared AOT set: each family's model shapes (replayssm.families) x {fp32, bf16 state}
    x bf16 io, L=16, both decode ops, and the ReplaySSM verify (with its commit) for draft
    capacities AOT_VERIFY_T; and per model shape the fp32 replay decode with an fp8 read copy
    and its verify (whose persistent kernel reads the copy). One entry per distinct module."""
    from ..families import FAMILIES  # the descriptors name the model shapes (and import this module)

    specs: dict[str, Specialization] = {}
    for state in ("float32", "bfloat16"):
        for fam in FAMILIES.values():
            for dims in fam.model_shapes.values():
                built = [
                    fam.spec("replay_decode", dims, state, "bfloat16", L=16),
                    fam.spec("conventional_decode", dims, state, "bfloat16"),
                    *(fam.spec("replay_verify", dims, state, "bfloat16", L=16, T=T) for T in AOT_VERIFY_T),
                ]
                if state == "float32":
                    built.append(fam.spec("replay_decode", dims, state, "bfloat16", L=16, read_dtype="float8_e4m3fn"))
                    built += [
                        fam.spec("replay_verify", dims, state, "bfloat16", L=16, T=T, read_dtype="float8_e4m3fn")
                        for T in AOT_VERIFY_T
                    ]
                specs.update((s.name, s) for s in built)
    return list(specs.values())


def compile_check_specializations() -> list[Specialization]:
    """Representative set CI compiles for sm_90a: every dtype, dim and state format appears at least once."""
    return [
        mamba2_decode_spec("replay_decode", 64, 128, "float32", "bfloat16", L=16),
        mamba2_decode_spec("replay_decode", 64, 256, "float32", "bfloat16", L=32, read_dtype="float8_e4m3fn"),
        mamba2_decode_spec("replay_decode", 128, 64, "float32", "float16", L=8, read_dtype="bfloat16"),
        mamba2_decode_spec("conventional_decode", 64, 128, "float32", "bfloat16"),
        mamba2_decode_spec("replay_decode", 80, 256, "bfloat16", "float16", L=32),
        mamba2_decode_spec("replay_decode", 128, 64, "float16", "float32", L=8),
        mamba2_decode_spec("conventional_decode", 80, 64, "bfloat16", "float32"),
        gdn_decode_spec("replay_decode", 128, 128, "float32", "bfloat16", L=16),
        gdn_decode_spec("conventional_decode", 128, 128, "float32", "bfloat16"),
        gdn_decode_spec("replay_decode", 64, 256, "bfloat16", "float16", L=32),
        gdn_decode_spec("replay_decode", 128, 128, "float32", "bfloat16", L=16, family="kda"),
        gdn_decode_spec("replay_decode", 128, 128, "float32", "bfloat16", L=16, read_dtype="float8_e4m3fn"),
        gdn_decode_spec("replay_decode", 64, 256, "float32", "float16", L=32, family="kda", read_dtype="bfloat16"),
        gdn_decode_spec("conventional_decode", 256, 64, "float16", "float32", family="kda"),
        mamba2_decode_spec("replay_verify", 64, 128, "float32", "bfloat16", L=16, T=4),
        mamba2_decode_spec("replay_verify", 80, 256, "bfloat16", "float16", L=32, T=16),
        mamba2_decode_spec("conventional_verify", 64, 128, "float32", "bfloat16", T=8),
        gdn_decode_spec("replay_verify", 128, 128, "float32", "bfloat16", L=16, T=4),
        gdn_decode_spec("replay_verify", 128, 128, "float32", "bfloat16", L=16, family="kda", T=8),
        gdn_decode_spec("conventional_verify", 128, 128, "float32", "bfloat16", family="kda", T=4),
        mamba2_decode_spec(
            "replay_decode", 64, 128, "float32", "bfloat16", L=16, read_dtype="float8_e4m3fn", single_copy=True
        ),
        mamba2_decode_spec(
            "replay_decode", 80, 256, "bfloat16", "float16", L=32, read_dtype="float8_e4m3fn", stochastic_rounding=True
        ),
        mamba2_decode_spec("replay_decode", 128, 128, "bfloat16", "bfloat16", L=8, stochastic_rounding=True),
        gdn_decode_spec(
            "replay_decode",
            128,
            128,
            "float32",
            "bfloat16",
            L=16,
            read_dtype="float8_e4m3fn",
            single_copy=True,
            stochastic_rounding=True,
        ),
        gdn_decode_spec(
            "replay_decode", 128, 64, "float16", "bfloat16", L=16, family="kda", read_dtype="float8_e4m3fn"
        ),
        gdn_decode_spec("replay_decode", 64, 128, "bfloat16", "float16", L=8, family="kda", stochastic_rounding=True),
        mamba2_decode_spec("replay_decode", 128, 256, "float32", "bfloat16", L=16, read_dtype="nvfp4"),
        gdn_decode_spec(
            "replay_decode", 128, 64, "bfloat16", "bfloat16", L=16, read_dtype="nvfp4", stochastic_rounding=True
        ),
        gdn_decode_spec("replay_decode", 256, 128, "float16", "bfloat16", L=8, family="kda", read_dtype="nvfp4"),
        mamba2_decode_spec("materialize", 80, 256, "bfloat16", "float16"),
        gdn_decode_spec("materialize", 256, 64, "float32", "bfloat16", family="kda"),
    ]
