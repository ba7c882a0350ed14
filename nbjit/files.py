"""Files nbjit reads and writes: a regular file read whole within a bound (``read_regular``:
a FIFO never waited on, a device never read) and an output written whole or not at all, or
written through where it is a device, a FIFO or an open descriptor (``write_output``: what
``nbjit bundle -o``, ``nbjit compile -o`` and the cache write with)."""
from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import sys
from typing import BinaryIO, Callable

__all__ = ["read_regular", "read_file", "write_output", "write_file", "MAX_FILE_BYTES"]

# a path that names an open descriptor: /dev/fd/N, /proc/self/fd/N, /proc/PID[/task/TID]/fd/N
_DESCRIPTOR = re.compile(r"/(?:dev/fd|proc/(self|thread-self|\d+)(?:/task/\d+)?/fd)/(\d+)")
_STANDARD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}


def _special(mode: int) -> str:
    """What a path that is not a regular file is, for messages."""
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a special file")


MAX_FILE_BYTES = 1 << 30  # no kernel image, source or metadata file is this large


def read_regular(path: str | os.PathLike, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes. A FIFO is never waited on, a
    device (or a link to /dev/zero) never read: ``ValueError`` says what the path is instead;
    ``OSError`` for what the system refuses."""
    return read_regular_stat(path, limit)[0]


def read_regular_stat(path: str | os.PathLike, limit: int = MAX_FILE_BYTES) -> tuple[bytes, os.stat_result]:
    """``read_regular`` with the file's ``fstat`` as it was opened."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{_special(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{st.st_size} bytes, more than nbjit reads ({limit})")
        # read what fstat says is there (asking for `limit` bytes would allocate that much
        # first: 256 MiB for a cache entry of a few KiB), then anything it grew by since
        parts, n = [], 0
        while n <= limit:
            want = min(max(st.st_size + 1 - n, 1 << 16), limit + 1 - n)
            chunk = os.read(fd, want)
            if not chunk:
                break
            parts.append(chunk)
            n += len(chunk)
            if len(chunk) < want and n >= st.st_size:
                break  # the end: a regular file reads short only there
        if n > limit:
            raise ValueError(f"more than {limit} bytes")
        return (parts[0] if len(parts) == 1 else b"".join(parts)), st
    finally:
        os.close(fd)




def read_file(path: str | os.PathLike, error: type[Exception], label: str | None = None) -> bytes:
    """``read_regular(path)``, its failures as one ``error``: ``"<label>: no such file"``,
    ``"<label>: cannot read it: <why>"`` (``label``: the path, or what names it)."""
    label = os.fsdecode(path) if label is None else label
    try:
        return read_regular(path)
    except FileNotFoundError:
        raise error(f"{label}: no such file") from None
    except OSError as e:
        raise error(f"{label}: cannot read it: {e.strerror or e}") from None
    except ValueError as e:
        raise error(f"{label}: cannot read it: {e}") from None


def write_file(path: str | os.PathLike, write: Callable[[BinaryIO], None], error: type[Exception],
               label: str | None = None) -> None:
    """``write_output(path, write)``, its failures as one ``error``: ``"cannot write <label>:
    <why>"`` (``label``: the path, or what names it)."""
    label = os.fsdecode(path) if label is None else label
    try:
        write_output(path, write)
    except OSError as e:
        raise error(f"cannot write {label}: {e.strerror or e}") from None
    except ValueError as e:
        raise error(f"cannot write {label}: it is {e}") from None


def write_output(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Make ``path`` hold what ``write(f)`` writes to the binary file ``f``. A regular file
    (or nothing yet), also at the end of a symbolic link, is replaced whole or not at all,
    keeping its permissions. A character device or a FIFO being read (``/dev/null``,
    ``/dev/stdout``, ``>(gzip > x.gz)``) is written through, never replaced by a file.
    A path that names an open descriptor (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``,
    or a link to one) is written through that descriptor, as ``-`` is: never a file renamed
    over what the shell redirected it to.
    Anything else (a directory, a block device, a socket, a FIFO nobody reads) is refused:
    ``ValueError`` says what the path is; ``OSError`` for what the system refuses."""
    named = _descriptor(path)
    if named is not None:
        _write_descriptor(*named, write)
        return
    try:  # (through links: /dev/stdout -> /proc/self/fd/1 -> a pipe that has no path to resolve)
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_through(os.fspath(path), st.st_mode, write)
        return
    target = os.path.realpath(path)  # write where a link points, never over the link
    tmp = os.path.join(os.path.dirname(target), f".nbjit-{os.getpid()}-{secrets.token_hex(6)}")
    fd = _unnamed_file(os.path.dirname(target))
    unnamed = fd is not None
    try:
        if fd is None:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to a new file
    except FileNotFoundError:  # (the only cause: no such directory) named as what is missing
        where = os.path.dirname(target if os.path.islink(path) else os.fspath(path)) or "."
        raise FileNotFoundError(errno.ENOENT, f"no directory {where}", os.fspath(path)) from None
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            write(f)
        if st is not None:
            os.fchmod(fd, stat.S_IMODE(st.st_mode))
        if unnamed:  # named only now: a process killed before this leaves no file behind
            _name_unnamed(fd, tmp)
        os.close(fd)
        fd = -1
        try:  # made a device or a directory meanwhile? still never renamed over
            now = os.stat(target).st_mode
        except FileNotFoundError:
            now = stat.S_IFREG
        if not stat.S_ISREG(now):
            raise ValueError(f"{_special(now)}, not a regular file")
        os.replace(tmp, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _unnamed_file(directory: str) -> int | None:
    """A descriptor of a new file with no name in ``directory`` (Linux's ``O_TMPFILE``, named
    later through ``/proc/self/fd``), or None where the system or file system has none."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(directory or ".", flag | os.O_RDWR, 0o666)
    except OSError:  # (not supported there, or no such directory: the named route says which)
        return None


def _name_unnamed(fd: int, path: str) -> None:
    """Give the unnamed file ``fd`` the name ``path`` (a hard link through /proc); where the
    file system refuses, a copy of it under that name."""
    d = os.open(os.path.dirname(path) or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:  # (a directory descriptor makes os.link call linkat, which follows /proc's link)
        os.link(f"/proc/self/fd/{fd}", os.path.basename(path), dst_dir_fd=d, follow_symlinks=True)
        return
    except OSError:
        pass
    finally:
        os.close(d)
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IMODE(os.fstat(fd).st_mode))
    with os.fdopen(out, "wb") as dst, os.fdopen(os.dup(fd), "rb") as src:
        src.seek(0)
        while chunk := src.read(1 << 20):
            dst.write(chunk)


def _descriptor(path: str | os.PathLike) -> tuple[str, int | None] | None:
    """(path, descriptor number in this process or None for another process's) where
    ``path``, or a link on its way, names an open descriptor; else None."""
    p = os.path.abspath(os.fspath(path))
    for _ in range(80):  # (as many links as the system follows, and the directories above them)
        if p in _STANDARD:
            return p, _STANDARD[p]
        m = _DESCRIPTOR.fullmatch(p)
        if m is not None:
            ours = m[1] in (None, "self", "thread-self") or m[1] == str(os.getpid())  # (None: /dev/fd)
            return p, int(m[2]) if ours else None
        whole = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
        if whole != p:  # (a link among the directories: /dev/fd -> /proc/self/fd)
            p = whole
            continue
        try:
            p = os.path.join(os.path.dirname(p), os.readlink(p))
        except (OSError, ValueError):  # not a link
            return None
    return None


def _write_descriptor(path: str, fd: int | None, write: Callable[[BinaryIO], None]) -> None:
    """``write`` through the open descriptor ``fd`` of this process (after what Python holds
    for standard output and error), or appended through ``path`` to another process's."""
    if fd is None:
        own = os.open(path, os.O_WRONLY | os.O_APPEND)
    else:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        own = os.dup(fd)
    with os.fdopen(own, "wb") as f:
        write(f)


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
