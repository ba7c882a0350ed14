"""The key's lock: processes that ask for the same cache entry at once make it once (an
exclusive ``flock`` on ``<key>.lock`` beside the entry, dropped by the OS where its holder
dies; where there is no ``fcntl``, each process makes its own)."""
from __future__ import annotations

import contextlib
import errno
import os
import time

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process lock, each process compiles
    fcntl = None  # type: ignore[assignment]

from nbjit.cache.entries import _LOCK_SUFFIX, _SUFFIX, _TMP_PREFIX, _open_making_directory, _remove, writer_alive


@contextlib.contextmanager
def _key_lock(f: str | None, lock_timeout: float):
    """An exclusive ``flock`` on ``<key>.lock`` beside the entry file ``f`` (None: no lock)
    while the entry is made, so that processes asking for the same entry at once run the
    compiler once. The OS drops the lock of a process that dies; after ``lock_timeout``
    seconds a waiter goes on without it. The holder removes the file as it lets go (so none
    pile up), and a waiter that then holds a removed file's lock takes the one at the path
    instead."""
    fd = None
    if f is not None and fcntl is not None:
        lock = f[:-len(_SUFFIX)] + _LOCK_SUFFIX
        deadline = time.monotonic() + lock_timeout
        while fd is None:
            try:
                # never through a link: a planted one would make a file outside the cache
                fd = _open_making_directory(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                break  # an unwritable cache (no lock, as no write), or a link there: no lock
            if not _flock(fd, deadline):
                os.close(fd)  # a holder that takes too long: make it ourselves
                fd = None
                break
            if not _is_at(fd, lock):
                os.close(fd)  # its holder finished and removed it: lock the file there now
                fd = None
                if time.monotonic() >= deadline:
                    break
    try:
        yield
    finally:
        if fd is not None:
            if _is_at(fd, lock):
                _remove(lock)  # still holding it: a waiter that has it open sees it gone
            os.close(fd)  # closing releases the lock


def _writer_alive(name: str) -> bool:
    """Whether the process that named this temporary file (.tmp-<pid>-...) still runs (a
    name of no pid, an older nbjit's, is reclaimed by age)."""
    return writer_alive(name[len(_TMP_PREFIX):])


def _flock(fd: int, deadline: float) -> bool:
    """Take an exclusive ``flock`` on ``fd``, waiting until ``deadline`` (monotonic) at most."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def _is_at(fd: int, path) -> bool:
    """Whether the open file ``fd`` is still the one at ``path`` (not removed or replaced)."""
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _remove_lock(path) -> int:
    """Remove a lock file nobody holds (one a killed process left); a held one stays, so
    that nobody makes its entry a second time meanwhile. A link is removed, never followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return _remove(path) if e.errno == errno.ELOOP else 0
    try:
        if fcntl is None:
            return 0
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # held: an entry is being made
        return _remove(path) if _is_at(fd, path) else 0
    finally:
        os.close(fd)
