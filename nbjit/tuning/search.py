"""``nbjit.tune``: a search over a space of choices for the fastest variant of a kernel, whose
answer is a cache entry (``answers.py``), and ``@nbjit.autotune``, the same for a launch
function called again and again.

A search compiles the variants at once (``compile_many``: a template's instantiations
several to a program), leaves out those not worth timing by what the compiler made
(``pruning.py``), times the others one after another on a stream of its own
(``timing.py``), inputs put back before each (``inputs.py``), and keeps the winner under a
key of the GPU's model, the driver, the target, the space and the user's ``key``. A
process that asks the same question of a GPU of the same model finds the answer and times
nothing."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from nbjit.errors import NbjitError, NbjitLaunchError, NbjitTuneError, warn
from nbjit.records import field, record
from nbjit.tuning.answers import Answer, answer_key, find, now, store, user_key
from nbjit.tuning.space import Space, variant_label
from nbjit.tuning.targets import Defines, LaunchFunction, Program, Template, as_target

__all__ = ["Trial", "Tuned", "tune", "autotune", "Autotuned", "prepare"]


@record(frozen=False, eq=False)
class Trial:
    """One variant of a search: its choices, launch settings, and what became of it:
    ``status`` is "timed" (``ms``: median time per launch), "pruned" or "failed" (``why``)."""

    config: dict
    grid: tuple | None = None
    block: tuple | None = None
    shared: int = 0
    status: str = "waiting"
    ms: float | None = None
    spread: tuple | None = None
    why: str = ""
    kernel: Any = field(default=None, repr=False)  # (module, kernel name) or a Kernel, where it compiled
    info: Any = field(default=None, repr=False)  # its KernelInfo as compiled (pruning), where known
    program: Any = field(default=None, repr=False)  # the Program that made it

    @property
    def label(self) -> str:
        return variant_label(self.config)


class Tuned:
    """The answer to a search: the winning ``config`` and its time, where it came from, and the
    winner ready to launch: ``tuned(*args, stream=s)``, or ``tuned.kernel[tuned.grid,
    tuned.block, s, tuned.shared](*args)``."""

    def __init__(self, target: Any, answer: Answer, key: str, trials: list[Trial], from_cache: bool,
                 settings: tuple, kernel: Any = None, seconds: dict | None = None) -> None:
        self.target, self.answer, self.key, self.trials, self.from_cache = target, answer, key, trials, from_cache
        self.grid, self.block, self.shared = settings
        self._kernel = kernel
        self.seconds = seconds or {}  # where a search's time went: {"compile": s, "timing": s} ({} from the cache)

    @property
    def config(self) -> dict:
        """The winning choices."""
        return dict(self.answer.config)

    @property
    def ms(self) -> float:
        """The winner's median time per launch, milliseconds."""
        return self.answer.ms

    @property
    def timed(self) -> int:
        """Variants timed by this call (0 where the answer came from the cache)."""
        return sum(t.status == "timed" for t in self.trials)

    @property
    def kernel(self) -> Any:
        """The winning variant's kernel (compiled, or found in the cache, on first use); None
        for a launch function."""
        if self._kernel is None and not isinstance(self.target, LaunchFunction):
            self._kernel = _winner_kernel(self.target, self.answer)
        return self._kernel

    def __call__(self, *args: Any, stream: Any = None) -> Any:
        """Launch the winner: the kernel with its settings, or the launch function with its choices."""
        if isinstance(self.target, LaunchFunction):
            return self.target.fn(*args, stream=stream, **self.answer.config)
        return self.kernel[self.grid, self.block, stream, self.shared](*args)

    def __repr__(self) -> str:
        how = "from the cache" if self.from_cache else f"{self.timed} timed"
        return f"<Tuned {variant_label(self.answer.config)}: {self.answer.ms:.4g} ms ({how})>"


def tune(target: Any, space: Mapping[str, Sequence], args: Sequence = (), *, key: Any = None,
         grid: Any = None, block: Any = None, shared: Any = None, metric: str = "time", cache: Any = None,
         retune: bool = False, timeout: float = 10.0, repeat: int = 10, rep_ms: float = 2.0,
         restore: Any = "auto", min_occupancy: float = 0.0, allow_spills: bool = False,
         workers: int | None = None) -> Tuned:
    """The fastest variant of ``target`` over ``space``, launched on ``args`` on the current GPU.

    target: ``nbjit.tuning.Template`` (a kernel template, ``"{CHOICE}"`` fields in its name
        expression), ``nbjit.tuning.Defines`` (a source, each choice a ``-D`` macro), an
        nbjit ``Kernel`` (its launch configuration), or a launch function
        ``fn(*args, stream=handle, **choices)``.
    space: ``{name: [choices]}``; every combination is a variant.
    key: what else the answer depends on, as JSON data (a shape bucket: ``(n // 4096,)``).
    grid, block, shared: each launch setting, a value or a function of the choices (a dict);
        default: the choice of that name (``shared``: 0). Not for a launch function.
    retune: search again, and replace the answer kept.
    timeout: seconds a variant may take (its warm-up and repetitions); one that takes longer
        is reported and left behind (its kernel keeps running), and the search goes on.
    repeat, rep_ms: repetitions timed, each of about ``rep_ms`` milliseconds of launches.
    restore: the arguments put back before each variant and at the end: "auto" (arrays given
        for pointers the kernel may write; every array for a launch function), True (every
        array), False, or their indices.
    min_occupancy, allow_spills: the variants left untimed by what the compiler made (below
        this occupancy; those that spill registers, unless allowed).

    Raises
    ------
    NbjitTuneError: a space, target, key or setting that does not fit, or no variant timed
    (each variant's reason given).
    """
    sp = Space(space)
    if metric != "time":
        raise NbjitTuneError(f"tune: metric {metric!r} is not one nbjit measures (it measures 'time')")
    _check_numbers(timeout, repeat, rep_ms, min_occupancy)
    t = as_target(target)
    if isinstance(t, (Template, Defines)):
        t.check(list(sp.choices))
    rule = _Settings(grid, block, shared, isinstance(t, LaunchFunction), list(sp.choices))
    from nbjit.cache.store import default_cache
    cache = default_cache() if cache is None else cache
    device = _device()
    ukey = user_key(key)
    akey = answer_key(device, _target_fields(t), sp.to_json(), metric, ukey)
    if not retune:
        answer = find(cache, akey)
        if answer is not None and sp.holds(answer.config):
            # (in the space's order, as a search gives it: the entry keeps its names sorted)
            answer = dataclasses.replace(answer, config={k: answer.config[k] for k in sp.choices})
            return Tuned(t, answer, akey, [], True, rule.of(answer.config))
    began = time.perf_counter()
    trials = prepare(t, sp, rule, device["arch"], workers=workers, min_occupancy=min_occupancy,
                     allow_spills=allow_spills)
    compiled = time.perf_counter()
    _time_all(t, trials, tuple(args), restore, timeout=timeout, repeat=repeat, rep_ms=rep_ms)
    seconds = {"compile": compiled - began, "timing": time.perf_counter() - compiled}
    timed = [x for x in trials if x.status == "timed"]
    if not timed:
        raise NbjitTuneError(f"tune {_label(t)}: no variant could be timed:\n" + _reasons(trials))
    best = min(timed, key=lambda x: x.ms)
    answer = Answer(dict(best.config), best.ms, device, _label(t), ukey, sp.to_json(),
                    {s: sum(x.status == s for x in trials) for s in ("timed", "pruned", "failed")} | {
                        "variants": len(trials)}, now(),
                    {"name_expressions": list(best.program.args["name_expressions"])}
                    if isinstance(t, Template) else {}, {x.label: round(x.ms, 6) for x in timed})
    store(cache, akey, answer, replace=retune)
    kernel = t if not isinstance(t, (Template, Defines, LaunchFunction)) else _kernel_of(best)
    return Tuned(t, answer, akey, trials, False, (best.grid, best.block, best.shared), kernel, seconds)


def _check_numbers(timeout, repeat, rep_ms, min_occupancy) -> None:
    for name, v, low in (("timeout", timeout, 0), ("rep_ms", rep_ms, 0), ("min_occupancy", min_occupancy, None)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                (low is not None and v <= low) or (low is None and not 0 <= v <= 1):
            raise NbjitTuneError(f"tune: {name} must be " + ("a fraction 0..1" if low is None else "a number > 0") +
                                 f", not {v!r}")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise NbjitTuneError(f"tune: repeat must be an int >= 1, not {repeat!r}")


class _Settings:
    """The launch settings of a variant, from ``tune``'s grid, block and shared."""

    def __init__(self, grid, block, shared, function: bool, names: list[str]) -> None:
        given = {k: v for k, v in (("grid", grid), ("block", block), ("shared", shared)) if v is not None}
        if function and given:
            raise NbjitTuneError(f"tune: {', '.join(given)}= apply to a kernel; a launch function launches itself")
        for what in ("grid", "block") if not function else ():
            if what not in given and what not in names:
                raise NbjitTuneError(f"tune: give {what}= (a value, or a function of the choices) or a choice named "
                                     f"{what!r}")
        self.given, self.function = given, function

    def of(self, config: Mapping[str, Any]) -> tuple:
        """(grid, block, shared) of a variant; (None, None, 0) for a launch function."""
        if self.function:
            return None, None, 0
        return (self._dims(self._value("grid", config), "grid", config),
                self._dims(self._value("block", config), "block", config),
                self._shared(self._value("shared", config, 0), config))

    def _value(self, what: str, config: Mapping[str, Any], default: Any = None) -> Any:
        v = self.given.get(what)
        if v is None:
            return config.get(what, default)
        if callable(v):
            try:
                return v(dict(config))
            except Exception as e:
                raise NbjitTuneError(f"tune: {what}= raised for {variant_label(config)}: {type(e).__name__}: {e}") \
                    from e
        return v

    @staticmethod
    def _dims(v: Any, what: str, config) -> tuple:
        """``v`` checked as a launch checks it (``launch.config``), kept as given (1-3 ints)."""
        from nbjit.launch.config import _dims
        try:
            return _dims(v, what, "tune")[:len(v) if isinstance(v, (tuple, list)) else 1]
        except NbjitLaunchError:
            raise NbjitTuneError(f"tune: {what} for {variant_label(config)} is {v!r}; it must be an int >= 1 or a "
                                 "tuple of 1-3 of them") from None

    @staticmethod
    def _shared(v: Any, config) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise NbjitTuneError(f"tune: shared for {variant_label(config)} is {v!r}; it must be bytes >= 0")
        return v


def _device() -> dict:
    """The current GPU as an answer's key names it: model, architecture, driver version."""
    from nbjit.arch import Arch
    from nbjit.gpu.driver import driver_version
    from nbjit.gpu.host import current_host
    from nbjit.gpu.timing import device_name
    host = current_host()
    ctx = host.current_context()
    return {"name": device_name(host.context_ordinal(ctx)), "arch": str(Arch.parse(host.context_cc(ctx))),
            "driver": driver_version()}


def _label(t: Any) -> str:
    """How messages and answers name the target: its own label, or a loaded kernel's name."""
    if isinstance(t, (Template, Defines, LaunchFunction)):
        return t.label()
    return f"kernel {_kernel_name(t)}"


def _target_fields(t: Any) -> dict:
    if isinstance(t, (Template, Defines, LaunchFunction)):
        return t.key_fields()
    from nbjit.read.image import content_digest
    img = t.module.image
    # (a @cuda.jit kernel's mangled names carry an ABI tag, B2v1, that counts Numba's compiles in
    # the process: the same kernel is B2v1 in one process and B2v7 in another)
    data = _NUMBA_TAG.sub(b"", img.data) if img.kind == "ptx" else img.data
    return {"kind": "kernel", "name": _kernel_name(t), "image": content_digest(data)}


def _kernel_name(kernel: Any) -> str:
    """A loaded kernel's name without Numba's per-process ABI tag."""
    return _NUMBA_TAG.sub(b"", kernel.name.encode()).decode()


_NUMBA_TAG = re.compile(rb"B\d+v\d+")


def prepare(t: Any, space: Space, rule: _Settings, arch: str, *, workers: int | None = None,
            min_occupancy: float = 0.0, allow_spills: bool = False) -> list[Trial]:
    """The trials of a search before any timing: each variant's launch settings, compiled
    (where the target compiles: at once, for ``arch``, loading nothing), and pruned by what
    the compiler made. No GPU is needed for a ``Template`` or ``Defines`` target."""
    from nbjit.tuning.pruning import why_not
    trials = []
    for c in space.variants():
        trials.append(Trial(c, *rule.of(c)))
    if isinstance(t, (Template, Defines)):
        _compile(t, trials, arch, workers)
    elif not isinstance(t, LaunchFunction):
        for x in trials:
            x.kernel, x.info = t, t.info
    for x in trials:
        if x.status == "failed" or isinstance(t, LaunchFunction):
            continue
        why = why_not(x.info, arch, x.block, x.shared, allow_spills=allow_spills, min_occupancy=min_occupancy)
        if why:
            x.status, x.why = "pruned", why
    return trials


def _compile(t: Template | Defines, trials: list[Trial], arch: str, workers: int | None) -> None:
    """Compile every variant's program at once; where a program of several variants fails,
    each of them alone, to say which fail."""
    from nbjit.loading.compiling import compile_many
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    configs = [x.config for x in trials]
    programs = t.programs(configs, workers or cpus)
    modules = compile_many([p.args for p in programs], lazy=True, return_exceptions=True, arch=arch,
                           workers=workers)
    retry: list[int] = []
    for p, m in zip(programs, modules):
        if isinstance(m, BaseException) and len(set(p.kernels)) > 1:
            retry.extend(p.variants)
            continue
        _settle(trials, p, m)
    if retry:
        alone = [t.alone(configs[i]) for i in retry]
        for i, p, m in zip(retry, alone, compile_many([p.args for p in alone], lazy=True, return_exceptions=True,
                                                      arch=arch, workers=workers)):
            p.variants = [i]
            _settle(trials, p, m)


def _settle(trials: list[Trial], p: Program, m: Any) -> None:
    """Record what a program gave its variants: the module's kernel and facts, or its error."""
    for i, name in zip(p.variants, p.kernels):
        x = trials[i]
        x.program = p
        if isinstance(m, BaseException):
            if not isinstance(m, NbjitError):
                raise m
            x.status, x.why = "failed", "compile failed: " + _first_error(m)
        else:
            x.kernel, x.info = (m, name), _compiled_info(m.image, name)


def _first_error(e: BaseException) -> str:
    """An NVRTC failure's first error line (else the error's first line)."""
    log = getattr(e, "log", "") or ""
    for line in log.splitlines():
        if "error" in line:
            return line.strip()[:300]
    return (str(e).splitlines() or [type(e).__name__])[0][:300]


def _compiled_info(image: Any, name: str) -> Any:
    """The KernelInfo of kernel ``name`` (a name expression) in a compiled image, or None."""
    lowered = image.lowered_names.get(name, name)
    typed = image.typed.get(lowered) if image.typed else None
    if typed is not None:
        return typed
    info = image.info
    if info is None and image.kind == "cubin":
        from nbjit.read.cubin import inspect_cubin
        info = inspect_cubin(image.data)
    try:
        return info.entry(lowered) if info is not None else None
    except KeyError:
        return None


def _kernel_of(x: Trial) -> Any:
    """A trial's kernel, loading its module where it waits."""
    k = x.kernel
    return k[0][k[1]] if isinstance(k, tuple) else k


def _winner_kernel(t: Any, answer: Answer) -> Any:
    """The winning variant's kernel in a process that found the answer: its program compiled
    as the search compiled it (a cache hit), or the loaded kernel the search was over."""
    from nbjit.loading.compiling import compile
    if not isinstance(t, (Template, Defines)):
        return t
    program = t.alone(answer.config, answer.program.get("name_expressions", ()))
    module = compile(program.args.pop("source"), **program.args)
    return module[program.kernels[0]]


def _reasons(trials: list[Trial], most: int = 12) -> str:
    lines = [f"  {x.label}: {x.status}: {x.why}" for x in trials if x.status != "timed"]
    more = f"\n  (and {len(lines) - most} more)" if len(lines) > most else ""
    return "\n".join(lines[:most]) + more


# streams a search left behind with a variant still running past its deadline, and the
# variant: a later search first waits for the caller's work, which would wait for them too
_LEFT: list = []


def _time_all(t: Any, trials: list[Trial], args: tuple, restore: Any, **how: Any) -> None:
    """Time each trial that is neither pruned nor failed, one after another."""
    from nbjit.gpu.timing import TimingStream, synchronize_context
    from nbjit.tuning.inputs import SavedInputs
    from nbjit.tuning.timing import time_variant
    todo = [x for x in trials if x.status == "waiting"]
    if not todo:
        return
    _check_left(t)
    synchronize_context()  # (the caller's work on its inputs)
    for x in todo:
        if not isinstance(t, LaunchFunction):
            _kernel_of(x)._loaded()  # (each module loaded now: not inside a timed launch, past no deadline)
    stream = TimingStream()
    saved, dead = None, False  # dead: a variant faulted, and CUDA is unusable in this process
    try:
        saved = SavedInputs(args, _restored(t, todo, args, restore), stream)
        for x in todo:
            saved.restore(stream)
            try:
                tm = time_variant(stream, _runner(t, x, args), **how)
            except Exception as e:
                dead = _faulted(e)
                _launch_failed(t, x, e, dead)
                continue
            if tm.ms is None:
                x.status, x.why = "failed", tm.why
                _LEFT.append((stream, f"{_label(t)}: {x.label}"))
                stream = TimingStream()
                continue
            x.status, x.ms, x.spread = "timed", tm.ms, tm.spread
    finally:
        if not dead:
            _finish(saved, stream, how["timeout"])


def _faulted(e: Exception) -> bool:
    """Whether a launch's error is a fault after which the process cannot use CUDA."""
    from nbjit.gpu import driver
    from nbjit.gpu.host import error_code
    return driver.STICKY_HINT in str(e) or error_code(e) in driver.STICKY_ERRORS


def _launch_failed(t: Any, x: Trial, e: Exception, faulted: bool) -> None:
    """Record a variant whose launch raised; raise where it faulted, and re-raise what is no
    launch's error of a kernel target."""
    if faulted:
        raise NbjitTuneError(f"tune {_label(t)}: variant {x.label} faulted, and this process cannot use CUDA any "
                             f"more: {e}") from e
    if not isinstance(e, NbjitError) and not isinstance(t, LaunchFunction):
        raise e
    x.status, x.why = "failed", f"launch failed: {type(e).__name__}: " + (str(e).splitlines() or [""])[0][:300]


def _check_left(t: Any) -> None:
    """Refuse to search while a variant an earlier search left behind still runs (waiting for
    the caller's work would wait for it); forget those that ended."""
    for stream, label in list(_LEFT):
        if stream.done():
            stream.close()
            _LEFT.remove((stream, label))
    if _LEFT:
        raise NbjitTuneError(f"tune {_label(t)}: variant {_LEFT[0][1]} of an earlier search still runs past its "
                             "deadline; no search can wait for this GPU's work until it ends (a kernel cannot be "
                             "stopped from the host: start a new process)")


def _finish(saved: Any, stream: Any, timeout: float) -> None:
    """Put the inputs back, and free their copies once the stream has done it. Where a
    variant's kernel may still run, the copies stay allocated (a free could wait for it)."""
    try:
        if saved is not None:
            saved.restore(stream)
            if stream.settle(time.monotonic() + timeout) and not _LEFT:
                saved.free()
            elif saved.parts:
                warn("nbjit.tune: a variant that passed its deadline may still run; the search's copies of the "
                     f"inputs ({sum(n for _, _, n in saved.parts)} bytes) stay allocated until the process ends")
    finally:
        stream.close()


def _runner(t: Any, x: Trial, args: tuple) -> Callable[[int], None]:
    if isinstance(t, LaunchFunction):
        fn, config = t.fn, x.config
        return lambda handle: fn(*args, stream=handle, **config)
    k, grid, block, shared = _kernel_of(x), x.grid, x.block, x.shared

    def run(handle: int) -> None:
        k[grid, block, handle, shared](*args)
    return run


def _restored(t: Any, todo: list[Trial], args: tuple, restore: Any) -> list[int]:
    """The indices of the arguments to put back (``tune``'s restore=)."""
    from nbjit.launch.arrays import array_layout
    if restore is False or restore is None:
        return []
    arrays = []
    for i, a in enumerate(args):
        try:
            array_layout(a)
            arrays.append(i)
        except ValueError:
            pass
    if restore is True:
        return arrays
    if restore == "auto":
        if isinstance(t, LaunchFunction):
            return arrays
        params = _kernel_of(todo[0]).params
        if len(params) != len(args):  # (a @cuda.jit kernel: an array is several parameters; none is const)
            return arrays
        return [i for i in arrays if not (params[i].pointer and params[i].const)]
    try:
        which = sorted({int(i) for i in restore})
    except (TypeError, ValueError):
        raise NbjitTuneError(f"tune: restore must be 'auto', True, False or argument indices, not {restore!r}") \
            from None
    bad = [i for i in which if not 0 <= i < len(args)]
    if bad:
        raise NbjitTuneError(f"tune: restore= names argument {bad[0]}; there are {len(args)}")
    return which


class Autotuned:
    """A launch function tuned on first use for each key: ``f(*args, stream=s)`` launches with
    the answer's choices (searched once per key and GPU model, then found in the cache)."""

    def __init__(self, fn: Callable, space: Space, key: Any, options: dict) -> None:
        self.target = LaunchFunction(fn)
        self.fn, self.space, self.key, self.options = fn, space, key, options
        self.answers: dict = {}  # (device, the key as JSON) -> the answer's choices
        self.lock = threading.Lock()  # one search per key at once

    def __call__(self, *args: Any, stream: Any = None) -> Any:
        from nbjit.gpu.driver import current_device
        k = self.key(*args) if callable(self.key) else self.key
        memo = json.dumps(user_key(k), sort_keys=True)
        config = self.answers.get((current_device(), memo))
        if config is None:
            with self.lock:
                config = self.answers.get((current_device(), memo))
                if config is None:
                    config = tune(self.target.fn, self.space.choices, args, key=k, **self.options).config
                    self.answers[(current_device(), memo)] = config  # (the device the search ran on)
        return self.fn(*args, stream=stream, **config)

    def tuned(self, *args: Any) -> Tuned:
        """The search's answer for these arguments' key (searching where none is kept)."""
        k = self.key(*args) if callable(self.key) else self.key
        return tune(self.target.fn, self.space.choices, args, key=k, **self.options)


def autotune(space: Mapping[str, Sequence], *, key: Any = None, **options: Any) -> Callable[[Callable], Autotuned]:
    """``@nbjit.autotune(space, key=lambda x, out, n: n // 4096)`` over a launch function
    ``fn(*args, stream=handle, **choices)``: each call launches with the choices ``tune``
    found for its key (a function of the arguments, or a value), searching on the first call
    of a key this GPU model has no answer for. ``options``: ``tune``'s."""
    sp = Space(space)
    if key is not None and not callable(key):
        user_key(key)

    def wrap(fn: Callable) -> Autotuned:
        return Autotuned(fn, sp, key, options)
    return wrap
