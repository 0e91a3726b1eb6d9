"""The offline corpus: the Python standard library's ``.py`` sources as bytes (vocabulary 256).

Files are found under ``sysconfig.get_paths()["stdlib"]`` (``site-packages`` / ``dist-packages``
folders excluded) and split by a fixed rule on the path relative to that folder, written with
``/``: a file is held out when ``zlib.crc32(path) % 10 == 0`` (about 10% of the files), otherwise it
is for training. Each split is the concatenation of its files' bytes in sorted path order, with no
separator. The split therefore depends only on the file names; the exact text depends on the
Python version, which ``Corpus.describe()`` records (with a hash of each split's bytes).

    corpus = load_corpus()
    sampler = TrainSampler(corpus.train, seq_len=1024, batch=32, seed=0)
    inp, tgt = sampler.next()                       # int64 [32, 1024] each, tgt = inp shifted by one
    seqs = heldout_sequences(corpus, length=16_384 + 512 + 1, rows=4)   # int64 [4, 16897]
"""

from __future__ import annotations

import hashlib
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

VOCAB = 256
HELD_OUT_MOD = 10
_SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__")


def is_held_out(rel_path: str) -> bool:
    """The split rule: ``rel_path`` (relative to the stdlib folder, '/'-separated) is held out when
    its CRC-32 is 0 modulo 10."""
    if not isinstance(rel_path, str):
        raise TypeError(f"rel_path: expected a str, got {type(rel_path).__name__}")
    return zlib.crc32(rel_path.encode("utf-8")) % HELD_OUT_MOD == 0


def stdlib_root() -> Path:
    """The standard library's folder of the running Python."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[str]:
    """Sorted '/'-separated paths, relative to ``root``, of every ``*.py`` file below it outside
    site-packages, dist-packages and __pycache__ folders."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"root: expected a folder, got {str(root)!r}")
    rels = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if any(part in _SKIP_DIRS for part in rel.parts[:-1]) or not p.is_file():
            continue
        rels.append(rel.as_posix())
    return sorted(rels)


def encode(data: bytes) -> torch.Tensor:
    """Bytes -> tokens: int64 [len(data)] with values in [0, 256)."""
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"data: expected bytes, got {type(data).__name__}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)


def decode(tokens: torch.Tensor) -> bytes:
    """Tokens -> bytes: any integer tensor of values in [0, 256), flattened."""
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.is_complex():
        raise TypeError(f"tokens: expected an integer torch.Tensor, got {getattr(tokens, 'dtype', type(tokens))}")
    t = tokens.detach().reshape(-1).cpu()
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= VOCAB):
        raise ValueError(f"tokens: expected values in [0, {VOCAB}), got [{int(t.min())}, {int(t.max())}]")
    return bytes(t.to(torch.uint8).tolist())


@dataclass
class Corpus:
    """The two splits: ``train`` and ``heldout`` uint8 [n] (bytes, concatenated in path order), and
    the files each came from (sorted relative paths)."""

    root: str
    train: torch.Tensor
    heldout: torch.Tensor
    train_files: list[str]
    heldout_files: list[str]

    def describe(self) -> dict:
        """What a result file records to identify the corpus."""
        import sys

        return {
            "root": self.root,
            "python": sys.version.split()[0],
            "rule": f"zlib.crc32(relative path) % {HELD_OUT_MOD} == 0 -> held out",
            "train_files": len(self.train_files),
            "train_bytes": int(self.train.numel()),
            "heldout_files": len(self.heldout_files),
            "heldout_bytes": int(self.heldout.numel()),
            "train_sha256": hashlib.sha256(self.train.numpy().tobytes()).hexdigest()[:16],
            "heldout_sha256": hashlib.sha256(self.heldout.numpy().tobytes()).hexdigest()[:16],
        }


def load_corpus(root: Path | str | None = None) -> Corpus:
    """Read and split the corpus under ``root`` (default: the running Python's stdlib folder)."""
    root = Path(root) if root is not None else stdlib_root()
    files = source_files(root)
    if not files:
        raise ValueError(f"root: no .py files below {str(root)!r}")
    train, held, train_files, held_files = bytearray(), bytearray(), [], []
    for rel in files:
        data = (root / rel).read_bytes()
        if is_held_out(rel):
            held += data
            held_files.append(rel)
        else:
            train += data
            train_files.append(rel)
    as_tensor = lambda b: torch.frombuffer(b, dtype=torch.uint8).clone() if b else torch.empty(0, dtype=torch.uint8)
    return Corpus(str(root), as_tensor(train), as_tensor(held), train_files, held_files)


class TrainSampler:
    """Random training windows from ``tokens`` (uint8/int64 [n]) with its own seeded generator.

    ``next()`` returns ``(inp, tgt)``, int64 [batch, seq_len] each on ``device``, where ``tgt`` is
    ``inp`` shifted by one byte. The same seed gives the same sequence of batches."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch: int, seed: int, device="cpu"):
        for name, v in (("seq_len", seq_len), ("batch", batch)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if tokens.dim() != 1 or tokens.numel() < seq_len + 2:
            raise ValueError(
                f"tokens: expected a 1-d tensor of at least seq_len + 2 = {seq_len + 2}, got {tuple(tokens.shape)}"
            )
        self.tokens, self.seq_len, self.batch, self.device = tokens, seq_len, batch, torch.device(device)
        self.gen = torch.Generator()
        self.gen.manual_seed(seed)
        self._offsets = torch.arange(seq_len + 1)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = torch.randint(0, self.tokens.numel() - self.seq_len - 1, (self.batch, 1), generator=self.gen)
        win = self.tokens[start + self._offsets].to(torch.int64).to(self.device, non_blocking=True)
        return win[:, :-1], win[:, 1:]


def heldout_sequences(corpus: Corpus, length: int, rows: int) -> torch.Tensor:
    """``rows`` consecutive, non-overlapping windows of ``length`` tokens from the start of the
    held-out stream: int64 [rows, length]. ValueError when the held-out text is too short."""
    for name, v in (("length", length), ("rows", rows)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a positive int, got {v!r}")
    need = length * rows
    if corpus.heldout.numel() < need:
        raise ValueError(
            f"rows x length: the held-out split has {corpus.heldout.numel()} tokens, {need} requested "
            f"({rows} x {length})"
        )
    return corpus.heldout[:need].to(torch.int64).view(rows, length).clone()
