"""Many sources at once (``compile_many``): each looked up and cached by this process as
``compile_image`` does it, what must be compiled compiled in threads of the call (NVRTC
releases the GIL) or in nbjit's worker processes (``workers.py``), fed from the calling
thread; Ctrl-C stops the call at once.

Worker processes run ``_compile_entry`` (NVRTC, the facts, the entry file written under the
key's lock) and ``_worker_init``."""
from __future__ import annotations

import collections
import os
import select
import threading
from dataclasses import replace
from typing import Iterable, Mapping

from nbjit.cache.entries import CacheEntry
from nbjit.cache.store import Written, make_locked, write_entry
from nbjit.errors import NbjitCompileError
from nbjit.read.image import Image
from nbjit.toolchain import nvrtc
from nbjit.toolchain.identity import _toolchain_fingerprint
from nbjit.toolchain.nvrtc import (
    _ROUTE, CompileJob, _derive_facts, _finish, _called, _left_running, _no_interrupts_here, _wait, compile_image,
    supported_archs)
from nbjit.toolchain.request import SOURCE_SUFFIXES, CompileRequest, read_once

__all__ = ["compile_many", "PROCESS_ROUTE_MIN"]


def _in_threads(fn, items: list, n: int) -> list:
    """``[fn(item) for item in items]``, run in ``n`` daemon threads, waited for on this one
    (as ``_interruptible``: Ctrl-C stops the wait at once; the threads then take no new item,
    and what they run ends there, its result dropped)."""
    results: list = [None] * len(items)
    todo = iter(range(len(items)))  # (each next() is one step under the GIL: an item per thread)
    stop: list = []
    errors: list = []
    left, lock, done = [n], threading.Lock(), threading.Event()

    def work():
        try:
            _no_interrupts_here()
            for i in todo:
                if stop:
                    break
                results[i] = fn(items[i])
        except BaseException as e:  # (fn's own errors are its results: this is a failure of the thread's)
            errors.append(e)
        finally:
            finished(1)

    def finished(count: int) -> None:
        with lock:
            left[0] -= count
            if left[0] <= 0:
                done.set()
    started = 0
    try:
        for k in range(n):
            threading.Thread(target=work, name=f"nbjit-compile-{k}", daemon=True).start()
            started += 1
    finally:
        if started < n:  # (a thread that could not start: the others do its share, or this raises)
            finished(n - started)
    try:
        _wait(done)
    except BaseException:
        stop.append(True)
        _left_running()
        raise
    if errors:
        raise errors[0]
    return results


def compile_many(sources: Iterable, *, workers: int | None = None, processes: bool | None = None,
                 return_exceptions: bool = False, **common) -> list[Image]:
    """Compile independent sources at once, each as ``compile_image`` would (through the
    cache and its per-key lock), and return their images in the order given.

    Parameters
    ----------
    sources: each CUDA C++ text, a ``.cu`` path, or a dict of ``compile_image``'s arguments
        (``{"source": ..., "name": ..., "options": ...}``) that override ``common``.
    workers: compiles at once, at most (default: the CPUs this process may use).
    processes: where NVRTC runs. Each source is looked up and cached by this process (the
        cache's memory, its files and their per-key locks as ``compile_image`` has them); what
        must be compiled is compiled in a thread of the call (NVRTC releases the GIL) or, on the
        process route, in one of nbjit's worker processes (fresh interpreters, never forks;
        they stay for the next call and exit after a minute idle), fed by the calling thread
        itself where workers are ready (no thread per source). ``None`` (default):
        the process route where ``workers`` (capped by the sources) is ``PROCESS_ROUTE_MIN``
        or more, compiling in threads until workers have started (the first call starts
        them); ``True``: always in workers, waiting for them to start; ``False``: in threads.
    return_exceptions: ``True``: a source that failed has its error (a ``CompileFailure``
        with NVRTC's log, an ``NbjitCompileError``...) in its place in the list, the others
        their images, and nothing is raised for it (``False``: the first failure is raised).
    common: ``compile_image``'s keyword arguments for every source (``arch``, ``options``...).

    Raises
    ------
    NbjitCompileError: naming the first source (in order) that failed, its index and name,
    with its error as the cause; the others still compiled (and were cached). Not raised for
    failed sources with ``return_exceptions=True`` (a bad argument of the call still is).
    """
    jobs = _many_jobs(sources, common)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise NbjitCompileError(f"compile_many: workers must be an int >= 1, not {workers!r}")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    n = max(1, min(len(jobs), workers or cpus))
    if processes not in (None, True, False):
        raise NbjitCompileError(f"compile_many: processes must be True, False or None, not {processes!r}")
    if type(return_exceptions) is not bool:
        raise NbjitCompileError(f"compile_many: return_exceptions must be True or False, not {return_exceptions!r}")
    _for_the_device(jobs)
    route = None
    if processes or (processes is None and n >= PROCESS_ROUTE_MIN):
        if os.name == "posix":  # (the workers' pipes are waited on with select)
            from nbjit.toolchain import workers as _workers
            # processes=None: while no worker is ready, a few compile in their threads (NVRTC
            # serialises compiles in threads beyond about two); the others wait for a worker
            slots = None if processes else _workers.Slots(max(1, min(n, PROCESS_INLINE, cpus)))
            route = (_workers.pool(_WORKER, _WORKER_INIT), n, processes is True, slots)

    def one(job):
        s, kw = job
        _ROUTE.make = None if route is None else (lambda job: _through_worker(route, job))
        try:
            return compile_image(s, **kw), None
        except Exception as e:  # reported below, in order, naming the source
            return None, e
        finally:
            _ROUTE.make = None

    results: list = [None] * len(jobs)
    todo = range(len(jobs))
    if route is not None and not route[0].broken and (route[2] or route[0].ready()):
        # workers ready (or to be waited for): all in this thread, no thread per source (each
        # source whose cache has a remote tier goes to a thread: the key's lock is this process's)
        todo = _on_workers(jobs, route[0], n, results)
    if n == 1 or len(todo) <= 1:
        for i in todo:
            results[i] = one(jobs[i])
    else:  # (daemon threads, waited for so that Ctrl-C stops the call at once: _in_threads)
        for i, r in zip(todo, _in_threads(one, [jobs[i] for i in todo], min(n, len(todo)))):
            results[i] = r
    if return_exceptions:
        return [img if e is None else e for img, e in results]
    failed = [(i, e) for i, (_, e) in enumerate(results) if e is not None]
    if failed:
        i, e = failed[0]
        raise NbjitCompileError(f"compile_many: source {i} ({_label(*jobs[i])}) failed{_more(failed)}: {e}") from e
    return [img for img, _ in results]


def _many_jobs(sources, common: dict) -> list:
    """``compile_many``'s items as ``(source, compile_image's arguments)``, checked before
    anything compiles."""
    jobs = []
    for i, s in enumerate(read_once(sources) if not isinstance(sources, (str, bytes, os.PathLike)) else (sources,)):
        kw = dict(common)
        if isinstance(s, Mapping):
            kw.update(s)
            if "source" not in kw:
                raise NbjitCompileError(f"compile_many: item {i} is a dict without 'source'")
            s = kw.pop("source")
        unknown = sorted(k for k in kw if k not in _IMAGE_ARGS)
        if unknown:  # (before anything compiles: an item's keys, or the call's own keywords)
            where = f"item {i}" if any(k not in common for k in unknown) else "the call"
            raise NbjitCompileError(f"compile_many: {where}: no argument {', '.join(map(repr, unknown))} "
                                    f"(compile_image takes {', '.join(_IMAGE_ARGS)})")
        jobs.append((s, kw))
    return jobs


def _for_the_device(jobs: list) -> None:
    """Items that name no architecture compiled for the current device's (as
    ``compile_image``), asked once; with every architecture named, no device is asked."""
    if any(kw.get("arch") is None for _, kw in jobs):
        from nbjit.gpu.host import current_host  # (a named architecture needs no driver, nor Numba)
        device = current_host().device_arch()
        for _, kw in jobs:
            if kw.get("arch") is None:
                kw["arch"] = device


def _label(s, kw: dict) -> str:
    """How ``compile_many``'s error names a source: its name, its file, or ``kernel.cu``."""
    return kw.get("name") or (os.fspath(s) if isinstance(s, os.PathLike) or (
        isinstance(s, str) and "\n" not in s and s.rstrip().lower().endswith(SOURCE_SUFFIXES)) else "kernel.cu")


def _more(failed: list) -> str:
    """`` (and 2 more: items 3, 5)`` after the first failure, where others failed too."""
    if not failed[1:]:
        return ""
    return f" (and {len(failed) - 1} more: item{'s' if failed[2:] else ''} {', '.join(str(j) for j, _ in failed[1:8])})"


PROCESS_ROUTE_MIN = 4  # compile_many(processes=None) takes worker processes from this many at once


PROCESS_INLINE = 4  # ... and compiles at most this many in its threads while no worker is ready


_WORKER = "nbjit.toolchain.many_sources:_compile_entry"


_WORKER_INIT = "nbjit.toolchain.many_sources:_worker_init"


def _worker_init() -> None:
    """A worker process's start: NVRTC loaded (no warm-up compile: one costs a whole small
    compile, ~50 ms on the 2-core machine, to save ~10 ms of the first real one)."""
    try:
        supported_archs()
        _toolchain_fingerprint()
    except Exception:  # (the first real compile reports what is wrong)
        pass


def _through_worker(route: tuple, job: CompileJob) -> CacheEntry:
    """``job.entry`` on ``compile_many``'s process route: what a miss needs done by a worker
    process where one is ready: the key's lock taken, NVRTC run, the facts read and the cache
    file written there (``cache.make_locked``); where the cache has a remote tier, the lock is
    this process's (the tier is looked in under it) and the worker compiles and writes the
    file under it. Where no worker is ready, compiled here as ``compile_image`` does (in one
    of the call's slots, where it has them: given back after)."""
    pool, want, wait, slots = route
    req, key, cache = job.request, job.key, job.cache
    taken = []

    def ask(lock_timeout):
        done, got = pool.try_call((req, _toolchain_fingerprint(), key, cache._file(key), cache.remote is not None,
                                   lock_timeout), want, wait, None if taken else slots)
        if done:
            return got
        if got is not None:
            taken.append(got)
        return None

    def make():
        got = ask(None) if cache.remote is not None else None  # (no remote tier: delegate asked already)
        return got if got is not None else nvrtc._run_nvrtc(req)

    try:
        return cache.get_or_create(key, make, lambda e: _derive_facts(e, req), lambda: ask(cache.lock_timeout))
    finally:
        if taken:
            pool.release(taken[0])


# compile_image's keyword arguments and their defaults, in its (and _called's) order
_IMAGE_ARGS = compile_image.__kwdefaults__


def _on_workers(jobs: list, pool, want: int, results: list) -> list[int]:
    """``compile_many``'s process route with workers ready (or ``processes=True``: waited for),
    all in the calling thread (``_Feed``). ``results[i]``: ``(image, None)`` or ``(None,
    error)``; returns the sources left to ``compile_image`` in threads: a cache with a
    remote tier (the key's lock is this process's), and where workers cannot start (the
    pool broke) those not yet sent."""
    feed = _Feed(pool, want, results)
    try:
        for i in range(len(jobs)):
            feed.prepare(i, *jobs[i])
            # the misses go out together once there are enough for the workers free (their
            # requests in a burst: sent before this process's time slice ends, the workers
            # woken then compiling); those prepared later, as workers reply
            if len(feed.pending) >= want - len(feed.busy) or i == len(jobs) - 1:
                feed.fill()
                if feed.busy and feed.pending:  # (the first replies while many sources are prepared)
                    feed.receive_ready(0)
        feed.finish()
    finally:
        feed.drop_busy()
    return sorted(feed.left)


class _Feed:
    """``_on_workers``'s state: each source prepared as ``compile_image`` prepares it (the
    memo, the request, its key) and looked up (memory, disk); the misses sent to idle
    workers (``make_locked`` there: the key's lock, NVRTC, the facts, the file written), up to
    ``want`` at once, each worker given the next miss as its reply comes (``poll`` over the
    busy workers' pipes: no limit on their descriptors' numbers, as ``select`` has). A thread
    per source would cost each source a thread start and GIL hand-overs before its request
    leaves, many milliseconds apart on busy CPUs (the workers compiling).

    A pending item is ``[(cache id, key), job, attempts]``; sources of one key wait on one
    compile (``waiting``)."""

    def __init__(self, pool, want: int, results: list):
        self.pool, self.want, self.results = pool, want, results
        self.fingerprint = _toolchain_fingerprint()
        self.left: list[int] = []
        self.waiting: dict = {}  # (cache id, key) -> [(index, job)]
        self.pending: collections.deque = collections.deque()
        self.busy: dict = {}  # a busy worker's pipe -> (worker, its pending item)
        self.replies = select.poll()  # (the busy workers' pipes)

    def prepare(self, i: int, source, kw: dict) -> None:
        """Source ``i``: its image (the memo's, or the cache's), or left to a thread (a remote
        tier), or queued for a worker."""
        try:  # (its keys are compile_image's: compile_many refused others)
            call = _called(source, *(kw.get(a, d) for a, d in _IMAGE_ARGS.items()))
            img = call.recalled()
            if img is None and call.cache.remote is not None:
                self.left.append(i)
                return
            if img is None:
                job = call.job()
                entry = job.cache.lookup(job.key, lambda e: _derive_facts(e, job.request))
                img = _finish(entry, job) if entry is not None else None
        except Exception as e:
            self.results[i] = None, e
            return
        if img is not None:
            self.results[i] = img, None
            return
        k = (id(job.cache), job.key)
        if k in self.waiting:
            self.waiting[k].append((i, job))
        else:
            self.waiting[k] = [(i, job)]
            self.pending.append([k, job, 0])

    def done(self, item, entry=None, error=None) -> None:
        for i, job in self.waiting.pop(item[0]):
            if error is None:
                try:
                    self.results[i] = _finish(entry, job), None
                except Exception as e:
                    self.results[i] = None, e
            else:
                self.results[i] = None, error

    def send(self, w, item) -> None:
        from nbjit.toolchain.workers import WorkerDied
        fd = w.fileno()
        self.busy[fd] = w, item
        job = item[1]
        try:
            w.send((job.request, self.fingerprint, job.key, job.cache._file(job.key), False, job.cache.lock_timeout))
        except WorkerDied as e:
            del self.busy[fd]
            self.pool.drop(w)
            self.again(item, e)
            return
        except Exception as e:  # (not sent: a request that does not pickle; the worker read nothing)
            del self.busy[fd]
            self.pool.put(w, answered=False)
            self.done(item, error=e)
            return
        self.replies.register(fd, select.POLLIN)

    def again(self, item, e) -> None:
        item[2] += 1
        if item[2] < 2:
            self.pending.appendleft(item)  # once more, in another worker
        else:
            self.done(item, error=e)

    def receive(self, fd) -> None:
        from nbjit.toolchain.workers import WorkerDied
        w, item = self.busy[fd]
        self.replies.unregister(fd)
        try:  # (interrupted here, the worker stays busy: drop_busy closes it)
            written = w.receive()
        except WorkerDied as e:
            del self.busy[fd]
            self.pool.drop(w)
            self.again(item, e)
            return
        except Exception as e:  # the target's own error (NVRTC's, say): the worker is fine
            del self.busy[fd]
            self.pool.put(w, answered=False)
            self.done(item, error=e)
            return
        del self.busy[fd]
        self.pool.put(w)
        job = item[1]
        try:
            entry = job.cache.adopt(job.key, written, lambda e: _derive_facts(e, job.request))
        except Exception as e:
            self.done(item, error=e)
            return
        self.done(item, entry)

    def receive_ready(self, timeout_ms) -> None:
        for fd, _ in self.replies.poll(timeout_ms):
            self.receive(fd)

    def fill(self) -> None:
        while self.pending and len(self.busy) < self.want:
            w = self.pool.take(self.want)
            if w is None:
                return
            self.send(w, self.pending.popleft())

    def finish(self) -> None:
        """Until every queued source has its reply (or is left to a thread: the pool broke)."""
        while self.pending or self.busy:
            self.fill()
            if not self.busy:
                if not self.pending:  # (the last sends failed: those sources have their errors)
                    break
                w = self.pool.take(self.want, timeout=1.0)  # none ready: wait for one starting
                if w is not None:
                    self.send(w, self.pending.popleft())
                elif self.pool.broken:  # the rest are compiled in threads, as compile_image does
                    self.left += [i for item in self.pending for i, _ in self.waiting.pop(item[0])]
                    self.pending.clear()
                continue
            # while sources wait and workers are starting, look for a ready one now and then
            self.receive_ready(10 if self.pending and self.pool.starting() else None)

    def drop_busy(self) -> None:
        """Interrupted: the busy workers' replies are never read (nor taken for others')."""
        if self.busy:
            self.pool.drop_all([w for w, _ in self.busy.values()])


def _compile_entry(req: CompileRequest, fingerprint: dict, key: str | None = None, file: str | None = None,
                   keep: bool = False, lock_timeout: float | None = None) -> "CacheEntry | Written":
    """In a worker process: the entry NVRTC makes of ``req``, with its facts. ``fingerprint``:
    the parent's NVRTC, which made the cache key: this process must load the same. With
    ``key``: the entry encoded as its cache file and written to ``file`` (where not None)
    as the parent's cache writes it (``write_entry``: a ``Written``; ``keep``: with the
    file's bytes, for the remote tier), the parent holding the key's lock; with
    ``lock_timeout`` too, under the key's lock taken here (``make_locked``)."""
    if fingerprint != _toolchain_fingerprint():
        raise NbjitCompileError(f"{req.name}: nbjit's worker process found another NVRTC than its parent's "
                                f"({_toolchain_fingerprint()} against {fingerprint}); compile_many(processes=False) "
                                "compiles in threads")

    def make() -> CacheEntry:
        entry = nvrtc._run_nvrtc(req)
        facts = _derive_facts(entry, req)
        return entry if facts is None else replace(entry, facts=facts)

    if key is None:
        return make()
    if lock_timeout is None:
        return write_entry(key, make(), file, keep)
    return make_locked(key, file, lock_timeout, make, keep)
