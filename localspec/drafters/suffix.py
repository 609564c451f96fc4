"""The suffix drafter: prompt lookup over the request, plus a persistent store of the model's
earlier answers and of files the user indexed, searched by suffix (SuffixDecoding, Oliaro et
al. 2025). Each proposal drafts from both and keeps the tree worth more; a person's work
repeats across requests (the same project, the same APIs, answers that echo earlier ones).

The store lives in one directory per target tokenizer:

    answers.log   every document, appended as it comes: a header naming the tokenizer, then
                  records of (length, crc32, tokens). A crash mid-write leaves a torn last
                  record, which the next open drops.
    index.bin     a snapshot of the suffix array over the log's first N bytes, written whole
                  and renamed into place, so opening does not re-sort every suffix; what the
                  log holds past N is replayed.

It is bounded in bytes: past the bound the oldest documents go, and both files are rewritten."""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec import _native, paths
from localspec.drafters.base import Budget, Drafter
from localspec.drafters.lookup import LookupDrafter, MatchAcceptance
from localspec.errors import LocalspecError
from localspec.progress import Notice, notice_on_stderr
from localspec.sampling import SamplingConfig
from localspec.verify import DraftTree

LOG_MAGIC, INDEX_MAGIC, VERSION = b"LSSUFLOG", b"LSSUFIDX", 1
RECORD = struct.Struct("<II")  # tokens, crc32 of their bytes
BYTES_PER_TOKEN = 12           # on disk: 4 in the log, 8 in the snapshot (token and suffix)
SNAPSHOT_EVERY = 1 << 20       # tokens replayed at most on open


def default_max_bytes() -> int:
    return int(float(os.environ.get("LOCALSPEC_SUFFIX_MB", "256")) * (1 << 20))


def store_dir(tokenizer: str) -> Path:
    """The default store for a tokenizer (LOCALSPEC_SUFFIX_DIR moves them all)."""
    root = os.environ.get("LOCALSPEC_SUFFIX_DIR")
    return (Path(root) if root else paths.cache_dir() / "suffix") / tokenizer[:16]


@dataclass(frozen=True)
class StoreSetting:
    """Where an engine's suffix store keeps the answers it learns, parsed once from what a
    caller writes: "" (the target tokenizer's folder in the cache directory), a directory,
    ":memory:" (kept by nothing: benchmarks, which roll it back) or "off" (no store)."""
    kind: str = "default"  # default | directory | memory | off
    directory: Path | None = None

    @classmethod
    def parse(cls, text: str | StoreSetting) -> StoreSetting:
        if isinstance(text, StoreSetting):
            return text
        if text in ("", "default", "off"):
            return cls(text or "default")
        return cls("memory") if text == ":memory:" else cls("directory", Path(text).expanduser())

    @property
    def off(self) -> bool:
        return self.kind == "off"

    def folder(self, tokenizer: str) -> Path | None:
        """The store's folder for a target with this tokenizer (None: in memory)."""
        if self.off:
            raise LocalspecError("the suffix store is off for this engine")
        return {"default": store_dir(tokenizer), "directory": self.directory}.get(self.kind)


class SuffixStore:
    """The documents and their suffix arrays (native), kept in `directory`; None: in memory
    only (benchmarks, which roll it back between configurations)."""

    def __init__(self, directory: Path | None, tokenizer: str, max_bytes: int | None = None,
                 notice: Notice = notice_on_stderr):
        """`notice` hears what was repaired on opening (a torn record dropped, the index rebuilt)."""
        self.notice = notice
        self.native = _native.SuffixStore()
        self.directory = directory
        self.tokenizer = tokenizer
        self.max_bytes = max_bytes or default_max_bytes()
        self.generation = 0
        self.synced = 0         # bytes of the log that the native store holds, from the start
        self.snapshotted = 0    # of those, what index.bin covers
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            with self._locked():
                self._open()

    @property
    def log(self) -> Path:
        return self.directory / "answers.log"

    @property
    def index(self) -> Path:
        return self.directory / "index.bin"

    def _locked(self):
        lock = open(self.directory / "lock", "a+b")
        fcntl.flock(lock, fcntl.LOCK_EX)
        return lock  # closing it releases the lock

    def _header(self) -> bytes:
        key = self.tokenizer.encode()
        return LOG_MAGIC + struct.pack("<II", VERSION, len(key)) + key + struct.pack("<Q", self.generation)

    def _open(self) -> None:
        if not self.log.exists() or self.log.stat().st_size == 0:
            self.generation = int.from_bytes(os.urandom(8), "little")
            paths.write_whole(self.log, self._header())
        with open(self.log, "rb") as f:
            start = self._check_header(f.read(4096), self.log, LOG_MAGIC)
        if not self._load_snapshot():
            self.synced = start
        self._catch_up()
        if self._evict():
            self._rewrite()

    def _check_header(self, data: bytes, path: Path, magic: bytes) -> int:
        """Where the header ends; one clear line if this is not a store for this tokenizer."""
        try:
            if data[:8] != magic:
                raise ValueError
            version, n = struct.unpack_from("<II", data, 8)
            key = data[16:16 + n].decode()
            generation, = struct.unpack_from("<Q", data, 16 + n)
        except (ValueError, struct.error, UnicodeDecodeError):
            raise LocalspecError(f"{path} is not a localspec suffix store (move it aside)") from None
        if version != VERSION:
            raise LocalspecError(f"{path}: suffix store version {version}, this localspec reads {VERSION}")
        if key != self.tokenizer:
            raise LocalspecError(f"{path} was made for another tokenizer ({key[:16]}, the target's is "
                                 f"{self.tokenizer[:16]}): use another store directory")
        if magic == LOG_MAGIC:
            self.generation = generation
        elif generation != self.generation:
            raise ValueError("snapshot of another log")
        return 24 + n

    def _load_snapshot(self) -> bool:
        """Load index.bin if it belongs to this log; False (and say why) if it does not."""
        if not self.index.exists():
            return False
        try:
            data = self.index.read_bytes()
            at = self._check_header(data, self.index, INDEX_MAGIC)
            covered, n_corpus, n_sorted, crc = struct.unpack_from("<QQQI", data, at)
            body = memoryview(data)[at + 28:]
            if len(body) != 4 * (n_corpus + n_sorted) or zlib.crc32(body) != crc \
                    or covered > self.log.stat().st_size:
                raise ValueError("torn or altered")
            self.native.load(np.frombuffer(body, np.int32, n_corpus),
                             np.frombuffer(body, np.uint32, n_sorted, 4 * n_corpus))
            self.synced = self.snapshotted = covered
            return True
        except (ValueError, struct.error, LocalspecError) as e:
            self.notice(f"rebuilding the suffix index ({self.index.name}: {e})")
            self.native = _native.SuffixStore()
            return False

    def _catch_up(self) -> None:
        """Add the log's records past `synced` (another process may have appended them) and
        drop a torn last record; start over if the log was rewritten meanwhile."""
        with open(self.log, "r+b") as f:
            head = f.read(4096)
            generation = self.generation
            self._check_header(head, self.log, LOG_MAGIC)
            if self.generation != generation and self.synced:  # compacted by another process
                self.native = _native.SuffixStore()
                self.synced = self.snapshotted = 0
                self._open()
                return
            f.seek(self.synced)
            data = f.read()
            at = 0
            while at + RECORD.size <= len(data):
                n, crc = RECORD.unpack_from(data, at)
                body = data[at + RECORD.size:at + RECORD.size + 4 * n]
                if len(body) != 4 * n or zlib.crc32(body) != crc:
                    break
                self.native.add(np.frombuffer(body, np.int32))
                at += RECORD.size + 4 * n
            self.synced += at
            if at < len(data):
                self.notice(f"dropped a torn record at the end of {self.log}")
                f.truncate(self.synced)

    # --- what the engine and `localspec index` call -------------------------------------------

    def add(self, tokens: list[int]) -> None:
        """Learn one document (an answer, a file)."""
        if not tokens:
            return
        array = np.asarray(tokens, np.int32)
        if self.directory is None:
            self.native.add(array)
            self._evict()
            return
        with self._locked():
            self._catch_up()
            record = _record(array)
            with open(self.log, "r+b") as f:
                f.seek(self.synced)
                f.write(record)
                f.flush()
                os.fsync(f.fileno())
            self.native.add(array)
            self.synced += len(record)
            if self._evict():
                self._rewrite()
            elif (self.synced - self.snapshotted) // 4 > SNAPSHOT_EVERY:
                self._snapshot()

    def checkpoint(self) -> int:
        return self.native.n_docs

    def rollback(self, n_docs: int) -> None:
        """Forget documents added after checkpoint() returned n_docs (in memory only)."""
        assert self.directory is None, "rolling back a store on disk"
        self.native.keep_first(n_docs)

    def close(self) -> None:
        if self.directory is not None and self.synced > self.snapshotted:
            with self._locked():
                if self.log.stat().st_size >= self.synced:
                    try:
                        self._snapshot()
                    except OSError as e:  # the log holds everything: the next open replays it
                        self.notice(f"suffix index not saved ({e.strerror or e}): the next start reads the log")

    def _snapshot(self) -> None:
        sorted_ = self.native.sorted()
        corpus = self.native.corpus()
        body = corpus.tobytes() + sorted_.tobytes()
        head = (self._header().replace(LOG_MAGIC, INDEX_MAGIC, 1)
                + struct.pack("<QQQI", self.synced, len(corpus), len(sorted_), zlib.crc32(body)))
        paths.write_whole(self.index, head + body)
        self.snapshotted = self.synced

    def _evict(self) -> bool:
        """Past the bound, drop the oldest documents down to 3/4 of it; whether it did."""
        if self.native.n_tokens * BYTES_PER_TOKEN <= self.max_bytes:
            return False
        self.native.keep_newest(self.max_bytes * 3 // 4 // BYTES_PER_TOKEN)
        return True

    def _rewrite(self) -> None:
        """Write the log and snapshot of what the store holds now, under a new generation (a
        crash in between leaves a snapshot of the old log, which the next open ignores)."""
        self.generation = int.from_bytes(os.urandom(8), "little")
        corpus = self.native.corpus()
        docs = np.split(corpus, np.flatnonzero(corpus == -1) + 1)
        log = self._header() + b"".join(_record(doc[:-1]) for doc in docs if len(doc) > 1)
        paths.write_whole(self.log, log)
        self.synced = len(log)
        self._snapshot()


def _record(tokens: np.ndarray) -> bytes:
    body = tokens.tobytes()
    return RECORD.pack(len(tokens), zlib.crc32(body)) + body


class SuffixDrafter(Drafter):
    name = "suffix"
    free = True  # a lookup and a binary search: Cascade may watch it while plain decoding runs
    learns = ("acceptance", "lookup.acceptance")

    def __init__(self, store: SuffixStore, max_match: int = 32, max_depth: int = 63,
                 alpha: float = 2.0, min_share: float = 0.1, own_first: float = 1.3, fim_suffix: int = -1):
        """`own_first`: a draft from the request's own context this sure of itself (its
        expected speedup) is taken without searching the store; `fim_suffix`: LookupDrafter's."""
        self.store = store
        self.own_first = own_first
        self.lookup = LookupDrafter(fim_suffix=fim_suffix)  # the request's own context
        self.max_match = min(max_match, _native.SuffixStore.depth - 1)
        self.max_depth, self.alpha, self.min_share = max_depth, alpha, min_share
        # Of store drafts: text of other documents starts as a weaker bet than the request's own.
        self.acceptance = MatchAcceptance(base=0.2, cap=0.7, long=(0.8, 0.85, 0.9))

    def begin(self, prompt: list[int], sampling: SamplingConfig) -> None:
        self.lookup.begin(prompt, sampling)

    def propose(self, context: list[int], budget: Budget) -> DraftTree:
        self.acceptance.start(context)
        own = self.lookup.propose(context, budget)
        if budget.speedup(own) >= self.own_first:
            # The request is copying its own text (an edit, a file it quotes): that is
            # fresher than any stored document, where an earlier version of the same code
            # matches as long and then goes stale at the edit.
            return own
        stored = self._from_store(context, budget)
        return max(own, stored, key=budget.speedup)

    def _from_store(self, context: list[int], budget: Budget) -> DraftTree:
        # Only continuations at least min_share of the occurrences took.
        tokens, parents, counts, n_match, n_occ = self.store.native.draft(
            np.asarray(context[-self.max_match:], np.int32), self.max_match, budget.max_nodes,
            self.max_depth, self.alpha, self.min_share)
        return self.acceptance.tree(tokens, parents, counts, n_match, n_occ, budget)


SKIP_DIRS = {"node_modules", "__pycache__", "venv", "build", "dist", "target"}
MAX_FILE_BYTES = 1 << 20


def text_files(roots: list[Path]) -> list[Path]:
    """The files under `roots` worth indexing: text (UTF-8) files of at most 1 MiB, outside
    hidden and build directories, in a stable order."""
    found = []
    for root in roots:
        if not root.exists():
            raise LocalspecError(f"{root}: no such file or directory")
        candidates = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in candidates:
            parts = path.relative_to(root).parts if path != root else ()
            if any(p.startswith(".") or p in SKIP_DIRS for p in parts[:-1]) or \
                    (parts and parts[-1].startswith(".")) or not path.is_file():
                continue
            if path.stat().st_size <= MAX_FILE_BYTES:
                found.append(path)
    return found


def index_files(store: SuffixStore, tokenize, files: list[Path], advance=lambda n: None) -> tuple[int, int]:
    """Add each text file as one document; (files added, tokens). Binary files are skipped."""
    n_files = n_tokens = 0
    for path in files:
        advance(1)
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip() or "\0" in text:
            continue
        tokens = tokenize(text)
        store.add(tokens)
        n_files += 1
        n_tokens += len(tokens)
    return n_files, n_tokens
