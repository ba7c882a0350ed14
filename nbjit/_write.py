"""A file written whole or not at all, or a device or FIFO written through
(``write_output``): what ``nbjit bundle -o``, ``nbjit compile -o`` and the cache write with.
Apart from ``image`` (its reads are on the way to a kernel; this is not)."""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from typing import BinaryIO, Callable

__all__ = ["write_output"]


def _special(mode: int) -> str:
    """What a path that is not a regular file is, for messages."""
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a special file")


def write_output(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Make ``path`` hold what ``write(f)`` writes to the binary file ``f``. A regular file
    (or nothing yet), also at the end of a symbolic link, is replaced whole or not at all,
    keeping its permissions. A character device or a FIFO being read (``/dev/null``,
    ``/dev/stdout``, ``>(gzip > x.gz)``) is written through, never replaced by a file.
    Anything else (a directory, a block device, a socket, a FIFO nobody reads) is refused:
    ``ValueError`` says what the path is; ``OSError`` for what the system refuses."""
    try:  # (through links: /dev/stdout -> /proc/self/fd/1 -> a pipe that has no path to resolve)
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_through(os.fspath(path), st.st_mode, write)
        return
    target = os.path.realpath(path)  # write where a link points, never over the link
    tmp = os.path.join(os.path.dirname(target), f".nbjit-{os.getpid()}-{secrets.token_hex(6)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to a new file
    except FileNotFoundError:  # (the only cause: no such directory) named as what is missing
        where = os.path.dirname(target if os.path.islink(path) else os.fspath(path)) or "."
        raise FileNotFoundError(errno.ENOENT, f"no directory {where}", os.fspath(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        try:  # made a device or a directory meanwhile? still never renamed over
            now = os.stat(target).st_mode
        except FileNotFoundError:
            now = stat.S_IFREG
        if not stat.S_ISREG(now):
            raise ValueError(f"{_special(now)}, not a regular file")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_through(target: str, mode: int, write: Callable[[BinaryIO], None]) -> None:
    """``write`` into the character device or FIFO ``target`` as it is (no creating, no truncating)."""
    if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        raise ValueError(f"{_special(mode)}, not a regular file")
    try:  # non-blocking: a FIFO nobody reads is refused, not waited on
        fd = os.open(target, os.O_WRONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        if e.errno == errno.ENXIO and stat.S_ISFIFO(mode):
            raise ValueError("a FIFO that no process is reading") from None
        raise
    try:
        now = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(now) or stat.S_ISFIFO(now)):
            raise ValueError(f"{_special(now)}, not a character device or FIFO")  # swapped since the stat
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        write(f)
