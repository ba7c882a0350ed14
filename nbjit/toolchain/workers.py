"""Worker processes that run one function on pickled arguments: where ``compile_many`` runs
NVRTC when many sources compile at once (see compiling.md, "Many sources at once").

Each worker is a fresh interpreter (``sys.executable -c``, this process's ``sys.path`` and
environment), never a fork: this process may hold a CUDA context, and a fork of it could not
use CUDA. It is not multiprocessing's spawn either, which imports the caller's ``__main__``
again in every worker (a script without an ``if __name__ == "__main__"`` guard would run
once per worker). A worker imports only the module of its function (``init`` runs once,
after start-up: loading and warming NVRTC), never Numba.

The protocol: length-prefixed pickles on the worker's stdin and on a copy of its original
stdout (its fd 1 then goes to stderr, so that a library printing cannot corrupt a reply).
A worker's stderr is its own (an unnamed temporary file, whose end a ``WorkerDied`` quotes),
never the caller's: a caller piped into ``tee`` sees its end of file when it exits. A worker
that waits ``IDLE_EXIT_S`` for work exits (its memory back: NVRTC keeps ~100 MB).

A worker dies with its parent, also in the middle of a compile (holding the key's lock): a
watchdog thread waits for its stdin to hang up (the parent's end closed: it exited, was
killed, or dropped this worker) and checks once a second that its parent is the one that
started it (a child the parent forked may hold that end open), then ends the process at once
(NVRTC cannot be stopped otherwise; the OS drops the lock). Not ``PR_SET_PDEATHSIG``, which
fires when the parent's *thread* that started the worker ends: here a starter thread that
ends as soon as no worker is starting. Ctrl-C at a terminal reaches workers too: they
ignore it (their parent drops those it interrupted). Imported by the caller only where
workers are used.
"""
from __future__ import annotations

import importlib
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

IDLE_EXIT_S = 60.0
PARENT_CHECK_S = 1.0  # how often a worker checks that its parent is alive (besides its stdin's hang-up)
_LEN = struct.Struct("<Q")
_PATH_ENV = "NBJIT_WORKER_SYS_PATH"
_BOOT = ("import json, os, sys\n"
         f"sys.path[:] = json.loads(os.environ.pop({_PATH_ENV!r}))\n"
         "from nbjit.toolchain.workers import serve\n"
         "serve(sys.argv[1], sys.argv[2], int(sys.argv[3]))\n")
_STDERR_TAIL = 2000  # characters of a dead worker's stderr its WorkerDied quotes


class WorkerDied(Exception):
    """A worker process that exited (or crashed) before it replied."""


def _function(spec: str):
    mod, _, name = spec.partition(":")
    return getattr(importlib.import_module(mod), name)


def _read(f) -> bytes | None:
    head = f.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    n = _LEN.unpack(head)[0]
    data = f.read(n)
    return data if len(data) == n else None


def _write(f, data: bytes) -> None:
    f.write(_LEN.pack(len(data)) + data)
    f.flush()


def serve(target: str, init: str, parent: int) -> None:  # pragma: no cover - runs in the worker
    """A worker's loop: ``init()`` once, "ready", then each request ``args`` answered with
    ``(True, target(*args))`` or ``(False, the exception)``, until stdin closes or it has
    waited ``IDLE_EXIT_S`` for one; ended at once where its ``parent`` is gone (``_watch``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a terminal's Ctrl-C is the parent's to handle)
    threading.Thread(target=_watch, args=(parent,), name="nbjit-worker-watchdog", daemon=True).start()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # (prints go to stderr)
    inp = os.fdopen(0, "rb")  # (one request at a time: nothing is read ahead of what select sees)
    if init:
        _function(init)()
    fn = _function(target)
    _write(out, pickle.dumps((True, os.getpid())))
    while True:
        if not select.select([inp], [], [], IDLE_EXIT_S)[0]:
            return  # idle: the parent starts another when it needs one
        raw = _read(inp)
        if raw is None:
            return  # the parent closed the pipe (or is gone)
        try:
            reply = pickle.dumps((True, fn(*pickle.loads(raw))), pickle.HIGHEST_PROTOCOL)
        except BaseException as e:  # sent to the parent, which raises it
            try:
                reply = pickle.dumps((False, e), pickle.HIGHEST_PROTOCOL)
            except Exception:  # an exception that does not pickle: its text
                reply = pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))
        _write(out, reply)


def _watch(parent: int) -> None:  # pragma: no cover - runs in the worker
    """A worker's watchdog: the process ends (status 1) once its stdin hangs up (its parent's
    end closed) or its parent is not ``parent`` any more (it died; the worker was adopted)."""
    hangup = select.poll()
    hangup.register(0, 0)  # (no events asked: POLLHUP and POLLERR are reported all the same)
    while not hangup.poll(PARENT_CHECK_S * 1000) and os.getppid() == parent:
        pass
    os._exit(1)


class _Worker:
    def __init__(self, target: str, init: str):
        env = dict(os.environ)
        env[_PATH_ENV] = json.dumps(sys.path)
        self.stderr = tempfile.TemporaryFile()  # (its own: never the caller's, which a pipe may be)
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, target, init, str(os.getpid())],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                         env=env, close_fds=True)
        except BaseException:
            self.stderr.close()
            raise
        self.ready = False
        self.answered = False
        self.started = time.monotonic()

    def poll_ready(self) -> bool:
        """Whether its start-up finished (reading its "ready", which is there, or not waiting)."""
        if not self.ready and select.select([self.proc.stdout], [], [], 0)[0]:
            self._reply()  # (raises WorkerDied where it failed to start)
            self.ready = True
        return self.ready

    def call(self, args: tuple):
        self.send(args)
        return self._reply()

    def send(self, args: tuple) -> None:
        """Send a request (its reply is read with ``receive``: the worker answers one at a time)."""
        self.answered = False  # (True once the reply was read whole: the pipe holds no other)
        try:
            _write(self.proc.stdin, pickle.dumps(args, pickle.HIGHEST_PROTOCOL))
        except OSError:  # a broken pipe: it exited
            raise WorkerDied(self._why()) from None

    def receive(self):
        """The reply to the request sent (waiting for it): the target's value, or its error raised."""
        return self._reply()

    def fileno(self) -> int:
        """Its replies' pipe (readable: a reply, or the worker gone), for ``select``."""
        return self.proc.stdout.fileno()

    def _reply(self):
        raw = _read(self.proc.stdout)
        if raw is None:
            raise WorkerDied(self._why())
        self.answered = True
        ok, value = pickle.loads(raw)
        if not ok:
            raise value
        return value

    def _why(self) -> str:
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.close()
            code = self.proc.returncode
        if code is not None and code < 0:
            why = f"the worker process was killed by signal {-code}"
        else:
            why = f"the worker process exited (status {code})"
        said = self._said()
        return f"{why}; it said: {said}" if said else why

    def _said(self) -> str:
        """The end of what the worker wrote to its stderr (a traceback, a library's message)."""
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - _STDERR_TAIL))
            return self.stderr.read().decode(errors="replace").strip()
        except (OSError, ValueError):  # (closed)
            return ""

    def close(self) -> None:
        self.close_pipes()
        self.reap(time.monotonic() + 0.5)

    def close_pipes(self) -> None:
        """Its pipes closed: it exits as its watchdog sees its stdin hang up."""
        for f in (self.proc.stdin, self.proc.stdout, self.stderr):
            try:
                f.close()
            except OSError:
                pass

    def reap(self, deadline: float) -> None:
        """Waited for until ``deadline`` (``time.monotonic()``), then killed."""
        if self.proc.poll() is None:
            try:
                self.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Slots:
    """How many callers may still run the target themselves while no worker is ready
    (``Pool.try_call``'s ``slots``): one ``compile_many`` call's compiles in its own threads
    while workers start."""

    def __init__(self, count: int):
        self.free = count


class Pool:
    """Worker processes running ``target`` (``"module:function"``), shared by the threads of
    this process; started on demand, up to the most any caller asked for at once."""

    def __init__(self, target: str, init: str = ""):
        self.target, self.init = target, init
        self._idle: list[_Worker] = []
        self._booting: list[_Worker] = []
        self._busy = 0
        self._lock = threading.Condition(threading.Lock())  # notified when a worker or a slot is free
        self._to_start = 0  # workers the starter thread is to start (it runs while any is booting)
        self._starting = 0  # workers it is starting now
        self._starter: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # a pipe that wakes the starter from its select
        self._pid = os.getpid()
        self.broken = ""  # why workers cannot start here (then none is started again)
        self.calls = 0  # calls answered by workers

    def workers(self) -> int:
        """Workers alive or starting (ready, busy or booting)."""
        with self._lock:
            return len(self._idle) + len(self._booting) + self._busy

    def ready(self) -> int:
        with self._lock:
            self._collect()
            return len(self._idle)

    def start(self, count: int) -> None:
        """Start workers (without waiting for them) until ``count`` are alive or starting."""
        with self._lock:
            self._collect()
            self._grow(count - len(self._idle) - self._busy)

    def try_call(self, args: tuple, want: int, wait: bool = False, slots: Slots | None = None):
        """``(True, target(*args))`` run in a ready worker, or ``(False, None)`` where none is
        ready (workers are then started, without waiting, up to ``want``: the caller runs it
        itself meanwhile). ``wait``: wait for a worker instead; ``slots``: take one of them
        where no worker is ready, ``(False, slots)`` (the caller runs it, then gives the slot
        back with ``release``), and where none is left wait for a worker or a slot. A worker that died
        before replying is replaced once; where workers cannot start at all, ``(False, None)``."""
        for attempt in (0, 1):
            with self._lock:
                while True:
                    w = self._take()
                    if w is not None:
                        self._busy += 1
                        break
                    if not self.broken:
                        self._grow(want - self._busy)
                    if self.broken or (slots is None and not wait):
                        return False, None
                    if slots is not None and slots.free > 0:
                        slots.free -= 1
                        return False, slots
                    self._lock.wait(1.0)  # (notified; the timeout is a safety net)
            try:
                value = w.call(args)
            except WorkerDied:
                w.close()
                with self._lock:
                    self._busy -= 1
                    self._lock.notify()
                if attempt:
                    raise
                continue
            except BaseException:
                if w.answered:  # the target's own error: the worker is fine
                    self._done(w)
                else:  # interrupted before its answer was read (Ctrl-C): it may still send one
                    w.close()
                    with self._lock:
                        self._busy -= 1
                        self._lock.notify()
                raise
            self._done(w, answered=True)
            return True, value
        return False, None  # (not reached)

    def take(self, want: int, timeout: float = 0.0) -> _Worker | None:
        """A ready worker, the caller's alone until it gives it back (``put``, or ``drop`` where
        its reply was not read), to ``send`` requests to and ``receive`` replies from itself; or
        None where none is ready within ``timeout`` seconds (workers are then started up to
        ``want``, counting the busy ones) or workers cannot start here (``broken``)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                w = self._take()
                if w is not None:
                    self._busy += 1
                    return w
                if not self.broken:
                    self._grow(want - self._busy)
                left = deadline - time.monotonic()
                if self.broken or left <= 0:
                    return None
                self._lock.wait(min(left, 1.0))

    def put(self, w: _Worker, answered: bool = True) -> None:
        """Give back a worker ``take`` gave, its reply read (``answered``: a value, counted in
        ``calls``; else the target's error)."""
        self._done(w, answered)

    def starting(self) -> bool:
        """Whether workers are starting (one may be ready soon)."""
        with self._lock:
            return bool(self._booting or self._starting or self._to_start)

    def drop(self, w: _Worker) -> None:
        """Give back a worker ``take`` gave whose reply was not read (interrupted, or it died):
        closed (a late reply is never taken for another request)."""
        self.drop_all([w])

    def drop_all(self, ws: list[_Worker]) -> None:
        """``drop`` for several at once: their pipes closed first, then each waited for within
        one half-second (16 workers interrupted mid-compile are not 16 waits one after another)."""
        for w in ws:
            w.close_pipes()
        deadline = time.monotonic() + 0.5
        for w in ws:
            w.reap(deadline)
        with self._lock:
            self._busy -= len(ws)
            self._lock.notify(len(ws))

    def release(self, slots: Slots) -> None:
        """Give back a slot ``try_call`` took (the caller ran the target itself)."""
        with self._lock:
            slots.free += 1
            self._lock.notify_all()  # (its waiters are among others': each checks its own)

    def _done(self, w: _Worker, answered: bool = False) -> None:
        with self._lock:
            self._busy -= 1
            self._idle.append(w)
            self.calls += answered
            self._lock.notify()

    def _take(self) -> _Worker | None:
        """(Under the lock.) An idle worker that is alive (those that exited go), or None."""
        while self._idle:
            w = self._idle.pop()
            if w.proc.poll() is None:
                return w
            w.close()
        return None

    def _grow(self, count: int) -> None:
        """(Under the lock.) Have ``count`` workers starting: the starter thread starts the
        missing ones (a process start takes milliseconds, not to be spent by a caller holding
        this lock; each worker then takes a few hundred to import and load NVRTC)."""
        short = count - len(self._booting) - self._starting - self._to_start
        if self.broken or short <= 0:
            return
        self._to_start += short
        if self._starter is None:
            if self._wake is None:
                self._wake = os.pipe()
                os.set_blocking(self._wake[1], False)
            self._starter = threading.Thread(target=self._start_and_watch, name="nbjit-workers", daemon=True)
            self._starter.start()
        else:
            try:
                os.write(self._wake[1], b"!")
            except BlockingIOError:  # (it has been woken already)
                pass

    def _start_and_watch(self) -> None:
        """The starter thread: starts the workers asked for and waits for them; each ready one
        joins the idle ones (and waiters are told). It ends when none is starting; should it
        fail, the pool is broken (its callers run the target themselves), never left waited on."""
        try:
            self._start_and_watch_loop()
        except BaseException as e:
            with self._lock:
                self.broken = self.broken or f"nbjit's worker starter failed: {type(e).__name__}: {e}"
                self._starting = self._to_start = 0
                self._starter = None
                self._lock.notify_all()

    def _start_and_watch_loop(self) -> None:
        wake = self._wake[0]
        while True:
            with self._lock:
                self._collect()
                self._lock.notify_all()
                n, self._to_start = self._to_start, 0
                self._starting = n
                if not n and not self._booting:
                    self._starter = None
                    return
            new = []
            try:
                for _ in range(n):
                    new.append(_Worker(self.target, self.init))
            except Exception as e:  # (no interpreter to run, too many processes...): the callers run it
                with self._lock:
                    self.broken = str(e) or type(e).__name__
                    self._lock.notify_all()
            with self._lock:
                self._booting += new
                self._starting = 0
                pipes = [w.proc.stdout for w in self._booting]
            try:
                if wake in select.select([*pipes, wake], [], [], 1.0)[0]:
                    os.read(wake, 64)
            except (OSError, ValueError):  # a pipe was closed (the pool closed): look again
                time.sleep(0.01)

    def _collect(self) -> None:
        """(Under the lock.) Booting workers that are ready join the idle ones; exited ones go."""
        now = []
        for w in self._booting:
            try:
                if w.poll_ready():
                    self._idle.append(w)
                    continue
            except Exception as e:  # it failed to start: none is started again (the callers compile)
                self.broken = str(e) or type(e).__name__
                w.close()
                continue
            if w.proc.poll() is not None:
                w.close()
                continue
            now.append(w)
        self._booting = now

    def close(self) -> None:
        with self._lock:
            ws, self._idle, self._booting = self._idle + self._booting, [], []
            self._to_start = 0
            self._lock.notify_all()
        for w in ws:
            w.close()


_POOLS: dict[tuple[str, str], Pool] = {}
_POOLS_LOCK = threading.Lock()


def pool(target: str, init: str = "") -> Pool:
    """This process's pool for ``target`` (made on first use)."""
    p = _POOLS.get((target, init))
    if p is None or p._pid != os.getpid():
        with _POOLS_LOCK:
            p = _POOLS.get((target, init))
            if p is None or p._pid != os.getpid():
                p = _POOLS[(target, init)] = Pool(target, init)
    return p


def _close_all() -> None:
    for p in list(_POOLS.values()):
        if p._pid == os.getpid():
            p.close()


def _forget_in_child() -> None:
    _POOLS.clear()  # a forked child's pools are its parent's: never used (nor closed) there


import atexit  # noqa: E402

atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
