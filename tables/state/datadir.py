"""The worker's data dir: checked at start, and held by one process at a time.

    check_data_dir(path)           # DataDirError unless it is a directory we can list and write;
                                   # StateFormatError for a store of a newer state format
    with lock_data_dir(path):      # DataDirLocked if another process holds it
        claim_data_dir(path, app_id)   # DataDirOfAnotherApp if another app id's state is there
        ...run the worker...

Both raise before anything opens RocksDB, with a message that names the directory and
the OS error, instead of a traceback from inside RocksDB in the middle of a rebalance.

    make_private(0o077, path)      # what the process creates from now on, and the dir itself:
                                   # no access for group and others (the state holds input values)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from pathlib import Path
from types import TracebackType

from tables.state.store import refuse_newer_format

LOCK_FILE = "tandem.lock"
APP_FILE = "tandem-app-id"  # the app id whose state the data dir holds
_PROBE_FILE = ".tandem-write-check"
log = logging.getLogger(__name__)


class DataDirError(Exception):
    """The data dir cannot be used; `path` names it, `cause` is the OS error if any."""

    def __init__(self, path: Path, message: str, cause: OSError | None = None) -> None:
        super().__init__(message)
        self.path = Path(path)
        self.cause = cause


class DataDirLocked(DataDirError):
    """Another process holds the data dir; `holder_pid` is its pid when it could be read."""

    def __init__(self, path: Path, holder_pid: int | None) -> None:
        holder = f"process {holder_pid}" if holder_pid is not None else "another process"
        super().__init__(
            path,
            f"data dir {path} is in use by {holder} (lock {Path(path) / LOCK_FILE}): "
            "one worker per data dir; give this worker its own",
        )
        self.holder_pid = holder_pid


class DataDirOfAnotherApp(DataDirError):
    """The data dir holds the state of another app id (a volume reused by a redeploy, a wrong
    TANDEM_DATA_DIR): its tables and changelog offsets belong to other topics."""

    def __init__(self, path: Path, owner: str, app_id: str) -> None:
        super().__init__(
            path,
            f"data dir {path} holds the state of app id {owner!r}, and this worker's app id is "
            f"{app_id!r}: refusing to start on another app's state (give this app a data dir of "
            f"its own, or move {path} away to start clean)",
        )
        self.owner = owner
        self.app_id = app_id


def claim_data_dir(path: Path | str, app_id: str) -> None:
    """Refuse a data dir that holds another app id's state; on the first start, record this app
    id in it (`tandem-app-id`). A data dir written before the record is taken as this app's.
    Raises DataDirOfAnotherApp (naming the dir and both app ids) or DataDirError."""
    path = Path(path)
    marker = path / APP_FILE
    try:
        owner = marker.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        owner = ""
    except (OSError, UnicodeDecodeError) as error:
        raise DataDirError(path, f"data dir {path}: {marker} cannot be read: {error}") from error
    if owner and owner != app_id:
        raise DataDirOfAnotherApp(path, owner, app_id)
    if not owner:
        try:
            path.mkdir(parents=True, exist_ok=True)
            marker.write_text(app_id + "\n", encoding="utf-8")
        except OSError as error:
            raise _os_error(path, f"cannot record the app id in {marker}", error) from error


def set_umask(umask: int | None) -> None:
    """The process's umask from now on (None: left as it is). RocksDB creates its own files
    (0644, less the umask): the umask is what makes them private. Set at the worker's first
    start, before the data dirs, Faust's table stores or the join's stores are created."""
    if umask is not None:
        os.umask(umask)


def make_private(umask: int | None, *paths: Path | str) -> None:
    """Take the bits `umask` masks off each existing directory of `paths` (the data dirs): what a
    worker wrote there before (0755 and 0644 under a 022 umask) is closed with them, as
    nobody else can enter the directory. None: modes left as they are."""
    if umask is None:
        return
    for path in map(Path, paths):
        try:
            mode = path.stat().st_mode & 0o7777
            if mode & umask:
                path.chmod(mode & ~umask)
        except FileNotFoundError:
            continue
        except OSError as error:  # not its owner (a directory an operator made): the worker goes on
            log.warning(
                "tandem: data dir %s keeps mode bits %03o open to others: %s (TANDEM_UMASK=%03o; "
                "chmod it, or set TANDEM_UMASK=inherit)",
                path, mode & umask, error.strerror, umask,
            )  # fmt: skip


def check_data_dir(path: Path | str) -> Path:
    """Create the data dir if missing and prove it usable: a directory this process can list,
    create, write, fsync and delete a file in, and whose table and partition directories it
    can enter and write. Returns the path. Raises DataDirError naming the path and the OS error,
    or StateFormatError for a partition store written by a newer state format (a rollback: its
    files are left as they are, and the worker stops before it joins its group)."""
    path = Path(path)
    _ensure_directory(path)
    _probe_write(path)
    for entry in _subdirectories(path, depth=2):
        if not os.access(entry, os.R_OK | os.W_OK | os.X_OK):
            raise DataDirError(path, f"data dir {path}: {entry} is not readable and writable by this user")
        if entry.parent != path and entry.name.isdigit():  # a partition's store, not .damaged/
            refuse_newer_format(entry)
    return path


def _ensure_directory(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as error:
        raise DataDirError(path, f"data dir {path} is a file, not a directory", error) from error
    except OSError as error:
        raise _os_error(path, "cannot be created", error) from error
    if not path.is_dir():
        raise DataDirError(path, f"data dir {path} is not a directory")


def _probe_write(path: Path) -> None:
    probe = path / f"{_PROBE_FILE}.{os.getpid()}"
    try:
        os.listdir(path)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"ok\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as error:
        with contextlib.suppress(OSError):
            probe.unlink()
        raise _os_error(path, "cannot be listed, or a file in it cannot be written", error) from error


def _subdirectories(path: Path, depth: int) -> list[Path]:
    """Directories up to `depth` levels below `path` (tables, then their partitions)."""
    found: list[Path] = []
    level = [path]
    for _ in range(depth):
        below: list[Path] = []
        for directory in level:
            try:
                below += [Path(e.path) for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
            except OSError as error:
                raise _os_error(path, f"cannot list {directory}", error) from error
        found += below
        level = below
    return found


def _os_error(path: Path, what: str, error: OSError) -> DataDirError:
    """`data dir <path>: <what>: <strerror> (<file>) [errno <name>]`."""
    name = os.strerror(error.errno) if error.errno is not None else str(error)
    where = f" ({error.filename})" if error.filename else ""
    code = errno.errorcode.get(error.errno, "?") if error.errno is not None else "?"
    return DataDirError(path, f"data dir {path}: {what}: {name}{where} [{code}]", error)


class DataDirLock:
    """An exclusive `flock` on `<data dir>/tandem.lock`, held until `release()` or exit from
    the `with` block; the kernel drops it when the process dies, however it dies."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Unlock (the lock file stays: deleting it would race with the next holder)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


def lock_data_dir(path: Path | str) -> DataDirLock:
    """Take the data dir for this process, and write our pid in its lock file. Raises
    DataDirLocked (naming the directory and the holder's pid) if another process, or
    another lock in this process, holds it; DataDirError if the lock file cannot be opened."""
    path = Path(path)
    lock_path = path / LOCK_FILE
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise _os_error(path, f"cannot open {lock_path}", error) from error
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirLocked(path, _holder_pid(lock_path)) from None
    except OSError as error:
        os.close(fd)
        raise _os_error(path, f"cannot lock {lock_path}", error) from error
    with contextlib.suppress(OSError):  # the pid is only for the message of the next one
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"%d\n" % os.getpid(), 0)
    return DataDirLock(path, fd)


def _holder_pid(lock_path: Path) -> int | None:
    try:
        return int(lock_path.read_text().strip())
    except (OSError, ValueError):
        return None
