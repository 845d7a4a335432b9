"""One RocksDB database (rocksdict, raw bytes) per table partition.

`<data_dir>/<table>/<partition>/` holds the join state of one task and, under
the key `checkpoint`, the last changelog offset that state contains. Both are
written in one WriteBatch, so after any crash state and offset agree. Closing
keeps the files: a partition that comes back replays only what it missed.

The store owns two keys, `format` and `checkpoint`; every other key is the
caller's opaque bytes. The local files are a cache of the changelog, so a store
that cannot be trusted is moved aside and replaced by an empty one
(`open_store`), never repaired in place and never allowed to stop the worker:

- `PartitionStore(path)` refuses a damaged store with `StoreCorruptError`, a
  store of a newer format with `StateFormatError`, and a store it cannot reach
  (lock held, permissions, read-only or full disk) with `StoreOpenError`;
- `open_store(path)` moves a damaged store to `<table>/.damaged/` (the newest
  `KEEP_DAMAGED` per table are kept), logs one WARNING, counts it
  (`damage_counts()`) and opens an empty store in its place;
- `safe_checkpoint(path)` reads a closed store's checkpoint without RocksDB and
  never raises (the assignor's local offsets).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import struct
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rocksdict import (
    AccessType,
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

log = logging.getLogger(__name__)

# The two keys the store owns. They sort outside every join key prefix (see keys.py).
CHECKPOINT_KEY = b"checkpoint"
FORMAT_KEY = b"format"
# The layout of the keys above and of the caller's keys. Bump it with any change a
# running older version would misread; stores of an older version are migrated
# (`_MIGRATIONS`) or, without a migration, rebuilt.
FORMAT_VERSION = 2
# Format 1 also held the join's time index (`x`) and id index (`i`), now kept in memory
# (tables/operators/window_index.py): 1 -> 2 deletes those keys.
_MIGRATIONS: dict[int, tuple[bytes, ...]] = {1: (b"x", b"i")}
KEEP_DAMAGED = 3  # damaged stores kept per table for inspection
DAMAGED_DIR = ".damaged"
# The checkpoint hint next to the RocksDB files, read by `safe_checkpoint`.
HINT_FILE = "tandem-checkpoint"
# The format version again, next to the RocksDB files: read before RocksDB opens them (an
# open for writing rewrites CURRENT, the MANIFEST and OPTIONS), and by the worker's start
# check. A version that bumps FORMAT_VERSION must write it too, before anything else.
FORMAT_FILE = "tandem-format"

_FORMAT = struct.Struct(">Q")
_OFFSET = struct.Struct(">Q")
_OFFSET_BIAS = 1 << 63  # the checkpoint's bytes are keys.encode_int's: signed, order-preserving


def encode_checkpoint(offset: int) -> bytes:
    return _OFFSET.pack(offset + _OFFSET_BIAS)


def decode_checkpoint(raw: bytes) -> int:
    """Raises struct.error unless `raw` is 8 bytes."""
    return int(_OFFSET.unpack(raw)[0]) - _OFFSET_BIAS


def partition_path(data_dir: Path, table: str, partition: int) -> Path:
    return Path(data_dir) / table / str(partition)


def local_partitions(data_dir: Path, table: str) -> list[int]:
    """Partitions of `table` that have a database on this disk."""
    root = Path(data_dir) / table
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / "CURRENT").exists())


# -- errors and what was done about them ----------------------------------------------


class StoreError(Exception):
    """A partition store could not be used; `path` names its directory."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = Path(path)


class StoreOpenError(StoreError):
    """The store could not be opened for a reason outside its files (its lock is held,
    permissions, a read-only or full disk). Nothing was moved or changed."""


class StoreCorruptError(StoreError):
    """The store's files cannot be trusted. `reason` is one of `DAMAGE_REASONS`."""

    def __init__(self, path: Path, reason: str, detail: str) -> None:
        super().__init__(path, f"state store {path} is damaged ({reason}: {detail})")
        self.reason = reason
        self.detail = detail


class StateFormatError(StoreError):
    """The store was written by a newer state format than this code knows. Left untouched:
    a rollback must not destroy the state of the newer deployment."""

    def __init__(self, path: Path, found: int, known: int) -> None:
        super().__init__(
            path,
            f"state store {path} has state format {found}, this code knows up to {known}: "
            "refusing to open it (left untouched; run the newer version, or move it away to rebuild)",
        )
        self.found = found
        self.known = known


class StoreWriteError(StoreError):
    """A write reached no disk (disk full, read-only, I/O error): the previous state and
    checkpoint are intact. The store accepts no more writes; close it and open it again."""

    def __init__(self, path: Path, error_number: int | None, detail: str) -> None:
        name = errno.errorcode.get(error_number, "?") if error_number is not None else "unknown errno"
        super().__init__(
            path,
            f"state store {path}: write failed ({name}: {detail}); "
            "the previous state and checkpoint are intact, nothing of this write was kept",
        )
        self.errno = error_number
        self.detail = detail


DAMAGE_REASONS = (
    "rocksdb_corruption",  # RocksDB reported Corruption (bad CURRENT, MANIFEST, table file)
    "rocksdb_open_failed",  # any other RocksDB open failure (a missing MANIFEST or table file, ...)
    "missing_current",  # no CURRENT file, but other RocksDB files
    "not_a_directory",  # a file where the store's directory should be
    "lost_data",  # had table or log files, opened empty (a MANIFEST that lost track of them)
    "unversioned",  # data but no format key: written before format versions, or lost that key
    "old_format",  # a format version older than this code's, and no migration
    "bad_format",  # a format value that is not a version
    "bad_checkpoint",  # a checkpoint value that is not an offset
    "checkpoint_behind_hint",  # RocksDB's checkpoint is behind the hint written after it
    "corruption_while_open",  # RocksDB reported Corruption in a read or write of an open store
    "changelog_recreated",  # (Faust table stores) its records came from an earlier topic of that name
)


@dataclass(frozen=True)
class Damage:
    """What `open_store` (or `rebuild_store`) found, and where the damaged files went."""

    path: Path
    reason: str
    detail: str
    moved_to: Path


_damage_counts: Counter[str] = Counter()


def damage_counts() -> dict[str, int]:
    """Damaged stores moved aside by this process, per reason (see `DAMAGE_REASONS`)."""
    return dict(_damage_counts)


# -- RocksDB options -----------------------------------------------------------------

# Shared by every partition database of the process, so memory stays flat however many
# partitions and keys a worker holds: index and filter blocks live in the block cache
# instead of growing with the data, and all memtables share one budget.
BLOCK_CACHE_BYTES = 64 << 20
MEMTABLE_BUDGET_BYTES = 128 << 20
WRITE_BUFFER_BYTES = 4 << 20  # per store (each partition)
_shared: dict[str, Any] = {}


def shared_memory() -> dict[str, int]:
    """Bytes in the RocksDB memory every join store of this process shares: the block cache
    and the memtables, each within its budget (`rocksdb_budgets`)."""
    if not _shared:
        return {"block_cache": 0, "memtables": 0}
    return {
        "block_cache": int(_shared["cache"].get_usage()),
        "memtables": int(_shared["memtables"].get_usage()),
    }


BUDGET_ENV = {"block_cache": "TANDEM_ROCKSDB_BLOCK_CACHE_MB", "memtables": "TANDEM_ROCKSDB_MEMTABLES_MB"}


def rocksdb_budgets(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(block cache, memtables) in bytes, shared by every join store of the process:
    BLOCK_CACHE_BYTES and MEMTABLE_BUDGET_BYTES, or TANDEM_ROCKSDB_BLOCK_CACHE_MB and
    TANDEM_ROCKSDB_MEMTABLES_MB (read when the first store opens; docs/operations.md)."""
    env = os.environ if env is None else env
    budgets = []
    for name, default in (("block_cache", BLOCK_CACHE_BYTES), ("memtables", MEMTABLE_BUDGET_BYTES)):
        raw = env.get(BUDGET_ENV[name], "").strip()
        if not raw:
            budgets.append(default)
            continue
        try:
            megabytes = float(raw)
        except ValueError:
            raise ValueError(f"{BUDGET_ENV[name]}={raw!r} is not a number") from None
        if megabytes < 1:
            raise ValueError(f"{BUDGET_ENV[name]} must be at least 1 (MB), not {raw}")
        budgets.append(int(megabytes * (1 << 20)))
    return budgets[0], budgets[1]


def _options() -> Options:
    if not _shared:
        cache_bytes, memtable_bytes = rocksdb_budgets()
        _shared["cache"] = Cache(cache_bytes)
        _shared["memtables"] = WriteBufferManager(memtable_bytes, False)
    table = BlockBasedOptions()
    table.set_block_cache(_shared["cache"])
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_bloom_filter(10, False)  # most duplicate checks look for a key that is absent
    # Index and filter in partitions of ~4 KB, only their top level pinned: a store's one
    # filter block (~1.3 MB per million keys) outgrew its shard of the block cache (64 MB
    # in 64 shards), so every point read past a few hundred thousand keys read and parsed it
    # again: 2 us -> 270 us per read (the index in RocksDB, TANDEM_WINDOW_INDEX=rocksdb,
    # docs/bench/memory.md). Partitions are cached like data blocks, bounded by the cache.
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(4096)
    table.set_pin_top_level_index_and_filter(True)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_manager(_shared["memtables"])
    # A join's records are short-lived: a memtable holds their puts and deletes until it is
    # flushed, and its write-ahead log as much on disk. At 32 MB a worker at a steady few
    # hundred records a second grew both for most of an hour (benchmarks/soak.py); at 4 MB the
    # flushes come every few minutes there, and a backlog's throughput did not change
    # (docs/bench/worker.md).
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    # RocksDB's info log starts a new file at each open and kept the old ones (1,000 by
    # default): a worker restarted every few minutes left one more per store each time.
    options.set_keep_log_file_num(2)
    return options


# -- telling damage from an environment problem ---------------------------------------

# Errors about the machine, not the files: moving the files aside would not help.
_ENVIRONMENT_ERRNOS = (
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EAGAIN,  # RocksDB's LOCK held by another process
    errno.ENOLCK,  # ... or by this one
    errno.EMFILE,
    errno.ENFILE,
    errno.ENOMEM,
)
_ERRNO_BY_TEXT = {os.strerror(number): number for number in sorted(errno.errorcode, reverse=True)}


def error_number(error: BaseException) -> int | None:
    """The errno of an OSError, or the one RocksDB names in its message ("IO error: No space
    left on device: While appending to file: ..."), else None."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno
    message = str(error)
    for number in _ENVIRONMENT_ERRNOS:  # checked first: a lock message names two errors
        if os.strerror(number) in message:
            return number
    for text, number in _ERRNO_BY_TEXT.items():
        if text in message:
            return number
    return None


def _is_corruption(error: BaseException) -> bool:
    return str(error).startswith("Corruption:")


# -- the store -----------------------------------------------------------------------


class PartitionStore:
    """The RocksDB database of one table partition.

    Raises StoreCorruptError (damaged files), StateFormatError (a newer format) or
    StoreOpenError (lock, permissions, disk); `open_store` turns damage into an empty store.
    """

    def __init__(self, path: Path, sync: bool = False) -> None:
        self.path = Path(path)
        self.sync = sync
        self.checkpoint: int | None = None
        self.damage: Damage | None = None  # set by open_store when it replaced a damaged store
        self._failed: StoreWriteError | None = None
        self._closed = False
        had_data = _inspect_before_open(self.path)
        refuse_newer_format(self.path)
        self._db = _open_rdict(self.path)
        self._hint = _CheckpointHint(self.path)
        try:
            self._check_format(had_data)
            self.checkpoint = self._read_checkpoint_value()
            self._check_against_hint()
            _write_format_file(self.path)
        except BaseException as error:
            self.close()
            if _from_rocksdb(error):  # e.g. the format key cannot be written: a full disk
                raise _open_error(self.path, error) from error
            raise
        # sync=True also survives a machine crash; a killed process loses nothing either way.
        self._write_options = WriteOptions()
        self._write_options.sync = sync

    def get(self, key: bytes) -> bytes | None:
        try:
            value: bytes | None = self._db.get(key)
        except Exception as error:
            raise self._read_error(error) from error
        return value

    def scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        # A fresh iterator bounded by `hi`, every time: an unbounded one (even a shared,
        # cheaper one) walks every tombstone after the range to the next live key, and
        # expiry leaves runs of them between join keys: seeks went from ~2 to ~70 us.
        options = ReadOptions()
        options.set_iterate_upper_bound(hi)
        iterator = self._db.iter(options)
        try:
            iterator.seek(lo)
            while iterator.valid():
                yield iterator.key(), iterator.value()
                iterator.next()
            # An iterator that hit a bad block can just stop being valid: only status() says so.
            iterator.status()
        except Exception as error:
            # The error's traceback keeps this frame, and a live iterator keeps the database
            # (and its LOCK) open past close(): a rebuild at the same path would then fail.
            del iterator
            raise self._read_error(error) from error

    def write(self, changes: Mapping[bytes, bytes | None], checkpoint: int | None) -> None:
        """Apply changes (None = delete) and move the checkpoint, atomically.

        Raises StoreWriteError if the write reached no disk (all of it or none is kept;
        the store then refuses further writes until reopened), StoreCorruptError if
        RocksDB found its files damaged."""
        if self._failed is not None:
            detail = f"an earlier write failed: {self._failed.detail}"
            raise StoreWriteError(self.path, self._failed.errno, detail)
        batch = WriteBatch(raw_mode=True)
        put, delete = batch.put, batch.delete
        # In key order: RocksDB inserts a sorted batch into its memtable faster than the
        # same keys in the order the batch wrote them. The keys sorted alone, not the
        # (key, value) pairs: half the cost of the sort.
        for key in sorted(changes):
            value = changes[key]
            if value is None:
                delete(key)
            else:
                put(key, value)
        if checkpoint is not None:
            batch.put(CHECKPOINT_KEY, encode_checkpoint(checkpoint))
            if self.checkpoint is not None and checkpoint < self.checkpoint:
                self._hint.clear()  # the hint may lag the checkpoint, never lead it
        try:
            self._db.write(batch, self._write_options)
        except Exception as error:
            if _is_corruption(error):
                raise StoreCorruptError(self.path, "corruption_while_open", str(error)) from error
            self._failed = StoreWriteError(self.path, error_number(error), str(error))
            raise self._failed from error
        if checkpoint is not None:
            self.checkpoint = checkpoint
            self._hint.write(checkpoint)

    @property
    def failed(self) -> StoreWriteError | None:
        """The write that failed, if one did: the store takes no more writes until reopened."""
        return self._failed

    def close(self) -> None:
        """Close the database (once; again is a no-op); files stay. Never raises: a close that
        cannot flush (a full disk, a failed store) leaves what was written in RocksDB's log."""
        if self._closed:
            return
        self._closed = True
        self._hint.close()
        _close_quietly(self._db, self.path)

    def destroy(self) -> None:
        """Close and delete the files (state that no longer matches its changelog)."""
        self.close()
        Rdict.destroy(str(self.path), _options())
        shutil.rmtree(self.path, ignore_errors=True)

    @staticmethod
    def read_checkpoint(path: Path) -> int | None:
        """The checkpoint of a database that is not open in this process, read from RocksDB
        (opened read-only). Raises on a damaged store: for the assignor use `safe_checkpoint`."""
        db = Rdict(str(path), _options(), access_type=AccessType.read_only())
        try:
            raw = db.get(CHECKPOINT_KEY)
        finally:
            db.close()
        return None if raw is None else decode_checkpoint(raw)

    # -- checks at open ------------------------------------------------------------

    def _check_format(self, had_data: bool) -> None:
        raw = self._db.get(FORMAT_KEY)
        if raw is None:
            if self._has_any_key():
                detail = "data but no format key: written before format versions, or lost the file holding it"
                raise StoreCorruptError(self.path, "unversioned", detail)
            if had_data:
                raise StoreCorruptError(self.path, "lost_data", "had table or log files but opened empty")
            self._db.put(FORMAT_KEY, _FORMAT.pack(FORMAT_VERSION))  # a new store
            return
        if len(raw) != _FORMAT.size:
            raise StoreCorruptError(self.path, "bad_format", f"format value {raw[:16]!r}")
        version = int(_FORMAT.unpack(raw)[0])
        if version > FORMAT_VERSION:
            raise StateFormatError(self.path, version, FORMAT_VERSION)
        if version < FORMAT_VERSION:
            if version in _MIGRATIONS:
                self._migrate(version)
                return
            reason = "old_format" if version >= 1 else "bad_format"
            raise StoreCorruptError(self.path, reason, f"format {version}, this code writes {FORMAT_VERSION}")

    def _migrate(self, version: int) -> None:
        """Bring a store of an older format to this one, in one write batch: deletes the keys
        under the prefixes the old format used and this one does not. The format file first:
        a rollback must find it before anything is rewritten."""
        _write_format_file(self.path)
        batch = WriteBatch(raw_mode=True)
        dropped = 0
        for prefix in _MIGRATIONS[version]:
            for key, _ in self.scan(prefix, prefix[:-1] + bytes([prefix[-1] + 1])):
                batch.delete(key)
                dropped += 1
        batch.put(FORMAT_KEY, _FORMAT.pack(FORMAT_VERSION))
        self._db.write(batch)
        log.info(
            "state store %s: format %d -> %d, %d keys dropped", self.path, version, FORMAT_VERSION, dropped
        )

    def _has_any_key(self) -> bool:
        iterator = self._db.iter()
        try:
            iterator.seek_to_first()
            return bool(iterator.valid())
        finally:
            del iterator  # not kept by a traceback: it would hold the database open (see scan)

    def _read_checkpoint_value(self) -> int | None:
        raw = self._db.get(CHECKPOINT_KEY)
        if raw is None:
            return None
        try:
            return decode_checkpoint(raw)
        except struct.error:
            raise StoreCorruptError(self.path, "bad_checkpoint", f"checkpoint value {raw[:16]!r}") from None

    def _check_against_hint(self) -> None:
        hinted = self._hint.read()
        if hinted is not None and (self.checkpoint is None or self.checkpoint < hinted):
            raise StoreCorruptError(
                self.path,
                "checkpoint_behind_hint",
                f"RocksDB checkpoint {self.checkpoint}, but {hinted} was written after it",
            )
        if self.checkpoint is not None and hinted != self.checkpoint:
            self._hint.write(self.checkpoint)

    def _read_error(self, error: Exception) -> Exception:
        if _is_corruption(error):
            return StoreCorruptError(self.path, "corruption_while_open", str(error))
        return error


def open_store(path: Path | str, sync: bool = False, keep_damaged: int = KEEP_DAMAGED) -> PartitionStore:
    """Open a partition's store; a damaged one is moved aside (`move_aside`), logged once
    at WARNING, counted (`damage_counts`) and replaced by an empty store, whose `damage`
    says what was found. The caller then restores the partition from its changelog
    (the empty store's checkpoint is None).

    Raises StateFormatError (a newer format: files untouched) or StoreOpenError (lock,
    permissions, disk: files untouched), never for damaged files."""
    path = Path(path)
    try:
        return PartitionStore(path, sync)
    except StoreCorruptError as error:
        return _replace_damaged(path, error, sync, keep_damaged)


def rebuild_store(
    store: PartitionStore, error: StoreCorruptError, keep_damaged: int = KEEP_DAMAGED
) -> PartitionStore:
    """After an open store's get/scan/write raised StoreCorruptError: close it, move it
    aside, and return an empty store at the same path (restore it from the changelog)."""
    store.close()
    return _replace_damaged(store.path, error, store.sync, keep_damaged)


def _replace_damaged(path: Path, error: StoreCorruptError, sync: bool, keep_damaged: int) -> PartitionStore:
    moved_to = move_aside(path, error.reason, error.detail, keep_damaged)
    _damage_counts[error.reason] += 1
    log.warning(
        "state store %s is damaged (%s: %s); moved it to %s and opened an empty store: "
        "the partition will be restored from its changelog",
        path,
        error.reason,
        one_line(error.detail),
        moved_to,
    )
    store = PartitionStore(path, sync)
    store.damage = Damage(path, error.reason, error.detail, moved_to)
    return store


def move_aside(
    path: Path, reason: str, detail: str, keep: int = KEEP_DAMAGED, into: Path | None = None
) -> Path:
    """Move a damaged store to `<table>/.damaged/<partition>-<UTC time>/` (or to `into`, a
    directory of that table's damaged stores alone), with a note of what was found
    (`tandem-damage.txt`), and delete all but the newest `keep` there.
    Raises StoreOpenError if it cannot be moved (nothing is deleted then)."""
    damaged = into if into is not None else path.parent / DAMAGED_DIR
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = damaged / f"{path.name}-{stamp}"
    try:
        damaged.mkdir(parents=True, exist_ok=True)
        os.rename(path, target)
    except OSError as error:
        raise StoreOpenError(
            path, f"state store {path} is damaged ({reason}: {detail}) and could not be moved aside: {error}"
        ) from error
    if target.is_dir():
        with contextlib.suppress(OSError):  # only a note for whoever inspects it
            (target / "tandem-damage.txt").write_text(f"{stamp} {path}\n{reason}: {detail}\n")
    _prune_damaged(damaged, keep)
    return target


def _prune_damaged(damaged: Path, keep: int) -> None:
    entries = sorted(damaged.iterdir(), key=lambda entry: entry.name.rpartition("-")[2], reverse=True)
    for old in entries[keep:]:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                old.unlink()


_unreadable_reported: set[Path] = set()


def safe_checkpoint(path: Path | str) -> int | None:
    """The checkpoint of a partition store, open or not, in this process or another, for the
    assignor's local offsets: read from its hint file, without opening RocksDB.
    Never raises: anything missing or unreadable is None (logged once per path).

    A hint, not the truth: it may lag RocksDB's checkpoint (never lead it), and it is
    reported only while the store's CURRENT names a MANIFEST that exists. A store damaged
    deeper (its MANIFEST or table files) still reports its hint until it is opened."""
    path = Path(path)
    try:
        checkpoint, problem = _hinted_checkpoint(path)
    except Exception as error:  # never take the caller down: it is only a hint
        checkpoint, problem = None, f"{type(error).__name__}: {error}"
    if problem is not None and path not in _unreadable_reported:
        _unreadable_reported.add(path)
        log.warning("state store %s: no local checkpoint reported (%s)", path, problem)
    return checkpoint


def _hinted_checkpoint(path: Path) -> tuple[int | None, str | None]:
    """(checkpoint, None), or (None, what is wrong), or (None, None) for nothing to read.
    Plain os calls: this runs for every local partition at every rebalance."""
    directory = os.fspath(path)
    current = _read_head(os.path.join(directory, "CURRENT"), 64)
    if current is None:
        if not os.path.exists(directory):
            return None, None
        return None, "no CURRENT file"
    manifest = current[:-1].decode("ascii", "replace")
    if not current.endswith(b"\n") or not manifest.startswith("MANIFEST-"):
        return None, f"CURRENT is damaged ({current[:32]!r})"
    try:
        manifest_size = os.stat(os.path.join(directory, manifest)).st_size
    except FileNotFoundError:
        manifest_size = 0
    if manifest_size == 0:
        return None, f"CURRENT names {manifest}, which is missing or empty"
    line = _read_head(os.path.join(directory, HINT_FILE), _HINT_SIZE + 1)
    if line is None:
        return None, None  # no checkpoint written yet, or a store from before the hint
    checkpoint = parse_hint(line)
    return (checkpoint, None) if checkpoint is not None else (None, f"{HINT_FILE} is damaged")


def _read_head(path: str, size: int) -> bytes | None:
    """Up to `size` bytes from the start of a file; None if there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def local_checkpoints(data_dir: Path | str, table: str) -> dict[int, int]:
    """Partition -> `safe_checkpoint` of every store of `table` on this disk. Never raises."""
    try:
        partitions = local_partitions(Path(data_dir), table)
    except OSError as error:
        log.warning("table %s in %s: not listable (%s); no local checkpoints", table, data_dir, error)
        return {}
    offsets = {p: safe_checkpoint(partition_path(Path(data_dir), table, p)) for p in partitions}
    return {p: offset for p, offset in offsets.items() if offset is not None}


def refuse_newer_format(path: Path | str) -> None:
    """Raise StateFormatError if the store's format file names a newer format than this code's;
    nothing is opened or changed. A missing or unreadable file passes: the format key in
    RocksDB, checked after the open, is the authority (stores from before the file)."""
    found = read_format_file(Path(path))
    if found is not None and found > FORMAT_VERSION:
        raise StateFormatError(Path(path), found, FORMAT_VERSION)


_FORMAT_LINE = b"tandem-state-format %d\n"


def read_format_file(path: Path) -> int | None:
    """The version in a store's format file; None if it is missing, unreadable or not one."""
    try:
        line = _read_head(os.path.join(os.fspath(path), FORMAT_FILE), 64)
    except OSError:
        return None
    parts = (line or b"").split()
    if len(parts) != 2 or parts[0] != b"tandem-state-format" or not parts[1].isdigit():
        return None
    return int(parts[1])


def _write_format_file(path: Path) -> None:
    """After the open proved the format: record it next to the files (once per store)."""
    if read_format_file(path) == FORMAT_VERSION:
        return
    try:
        (path / FORMAT_FILE).write_bytes(_FORMAT_LINE % FORMAT_VERSION)
    except OSError as error:  # only an early warning: the key in RocksDB stays the authority
        log.warning("state store %s: format file not written (%s)", path, error)


# -- which changelog the state came from -----------------------------------------------

CHANGELOG_ID_FILE = "tandem-changelog-id"
_CHANGELOG_ID_LINE = b"tandem-changelog-id %s %s\n"


def read_changelog_id(path: Path | str, topic: str) -> str | None:
    """The id (Kafka's topic id, hex) of the changelog `topic` whose records the store at `path`
    holds, as recorded next to its files; None when none is recorded for that topic (a store
    from before the record, a new one, or a file that is damaged)."""
    try:
        line = _read_head(os.path.join(os.fspath(path), CHANGELOG_ID_FILE), 512)
    except OSError:
        return None
    parts = (line or b"").split()
    if len(parts) != 3 or parts[0] != b"tandem-changelog-id" or parts[1] != topic.encode():
        return None
    return parts[2].decode("ascii", "replace")


def write_changelog_id(path: Path | str, topic: str, topic_id: str) -> None:
    """Record that the store at `path` holds records of the changelog `topic` whose id is
    `topic_id`. A failed write only loses the check (logged): nothing depends on it."""
    target = Path(path) / CHANGELOG_ID_FILE
    try:
        target.write_bytes(_CHANGELOG_ID_LINE % (topic.encode(), topic_id.encode()))
    except OSError as error:
        log.warning("state store %s: changelog id not recorded (%s)", path, error)


def inspect_before_open(path: Path) -> bool:
    """Raise StoreCorruptError for damage visible before RocksDB opens the files (a missing
    CURRENT with RocksDB files beside it, a file where the directory should be); whether the
    directory holds table or log data. For any RocksDB store, Tandem's or Faust's."""
    return _inspect_before_open(path)


def classify_open_error(path: Path, error: BaseException) -> StoreError | None:
    """What a failed RocksDB open of `path` means: StoreCorruptError (its files are damaged:
    set them aside), StoreOpenError (the machine: a lock, permissions, the disk; leave them),
    or None for an error that did not come from RocksDB (a bug: let it through)."""
    if not isinstance(error, Exception) or not _from_rocksdb(error):
        return None
    return _open_error(path, error)


def one_line(text: str) -> str:
    """RocksDB's message on one line (some span several): a log line per event."""
    return " ".join(text.split())


def _inspect_before_open(path: Path) -> bool:
    """Damage visible before RocksDB opens the files (RocksDB would create a new database
    over them, or delete table files a damaged MANIFEST lost track of). Returns whether the
    directory holds table or log data."""
    if path.exists() and not path.is_dir():
        raise StoreCorruptError(path, "not_a_directory", "a file where the store's directory should be")
    if not path.is_dir():
        return False
    names = [entry.name for entry in os.scandir(path)]
    rocks_files = [n for n in names if n.startswith("MANIFEST-") or n.endswith((".sst", ".log"))]
    if "CURRENT" not in names and rocks_files:
        raise StoreCorruptError(path, "missing_current", f"no CURRENT file, but {sorted(rocks_files)[:5]}")
    return any(n.endswith(".sst") or (n.endswith(".log") and (path / n).stat().st_size > 0) for n in names)


def _open_rdict(path: Path) -> Rdict:
    """Open (or create) the database; damage raises StoreCorruptError, anything about the
    machine (lock, permissions, disk) StoreOpenError."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        return Rdict(str(path), _options())
    except Exception as error:
        if not _from_rocksdb(error):
            raise
        raise _open_error(path, error) from error


def _from_rocksdb(error: BaseException) -> bool:
    """rocksdict raises a bare Exception with RocksDB's status text, or an OSError; anything
    else is a bug here, which must not pass for damaged files (and rebuild every store)."""
    return type(error) is Exception or isinstance(error, OSError)


def _open_error(path: Path, error: BaseException) -> StoreError:
    if error_number(error) in _ENVIRONMENT_ERRNOS or isinstance(error, NotADirectoryError):
        return StoreOpenError(path, f"cannot open state store {path}: {error}")
    reason = "rocksdb_corruption" if _is_corruption(error) else "rocksdb_open_failed"
    return StoreCorruptError(path, reason, str(error))


def _close_quietly(db: Rdict, path: Path) -> None:
    try:
        db.close()
    except Exception as error:
        log.warning("state store %s: close failed (%s); what was written stays in its log", path, error)


# -- the checkpoint hint -------------------------------------------------------------

_HINT_TEMPLATE = b"tandem-checkpoint %020d %08x\n"
_HINT_SIZE = len(_HINT_TEMPLATE % (0, 0))


class _CheckpointHint:
    """The last checkpoint, also in a small file next to the RocksDB files, so the assignor
    can read it without opening RocksDB. Written after each RocksDB write that moves the
    checkpoint, in place (one pwrite of a fixed-size line, with a CRC): it may lag RocksDB,
    never lead it. A replace-by-rename cost 200-300 us per commit on ext4, pwrite 2.4 us
    (benchmarks/bench_store.py)."""

    def __init__(self, store_path: Path) -> None:
        self.path = store_path / HINT_FILE
        self._fd: int | None = None

    def read(self) -> int | None:
        return read_hint(self.path)

    def write(self, checkpoint: int) -> None:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            line = _HINT_TEMPLATE % (checkpoint, zlib.crc32(b"%d" % checkpoint))
            os.pwrite(self._fd, line, 0)
        except OSError as error:  # a hint that lags is allowed: RocksDB has the checkpoint
            log.warning("state store %s: checkpoint hint not updated (%s)", self.path.parent, error)
            self.clear()

    def clear(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_hint(path: Path) -> int | None:
    """The checkpoint in a hint file; None if it is missing, torn or not a hint. Raises OSError
    only for an unreadable file."""
    line = _read_head(os.fspath(path), _HINT_SIZE + 1)
    return None if line is None else parse_hint(line)


def parse_hint(line: bytes) -> int | None:
    parts = line.split()
    if len(line) != _HINT_SIZE or len(parts) != 3 or parts[0] != b"tandem-checkpoint":
        return None
    try:
        checkpoint, crc = int(parts[1]), int(parts[2], 16)
    except ValueError:
        return None
    return checkpoint if zlib.crc32(b"%d" % checkpoint) == crc else None
