"""How one variant is timed: a first launch (warm-up: a module loads, caches fill), one more
to size a repetition at about ``rep_ms``, then ``repeat`` repetitions of that many launches
between CUDA events; the variant's time is the median repetition's, per launch, so that a
repetition slowed by something else on the machine does not decide it. Every wait has the
variant's deadline: one that passes it is reported as such, and the search goes on."""
from __future__ import annotations

import statistics
import time
from typing import Callable

from nbjit.gpu.timing import TimingStream
from nbjit.records import record

__all__ = ["Timing", "time_variant"]

MAX_LAUNCHES_PER_REP = 1000


@record
class Timing:
    """A variant's time per launch (milliseconds: the median repetition's) and the spread of
    its repetitions (first and third quartile); or why it has none."""

    ms: float | None
    spread: tuple[float, float] | None = None
    why: str = ""


def time_variant(stream: TimingStream, launch: Callable[[int], None], *, timeout: float, repeat: int,
                 rep_ms: float) -> Timing:
    """Time ``launch(stream_handle)`` (one launch) on ``stream`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    if stream.time(launch, deadline) is None:
        return Timing(None, why=f"did not finish within timeout={timeout} s")
    one = stream.time(launch, deadline)
    if one is None:
        return Timing(None, why=f"did not finish within timeout={timeout} s")
    n = max(1, min(MAX_LAUNCHES_PER_REP, int(rep_ms / max(one, 1e-4))))

    def run(handle: int) -> None:
        for _ in range(n):
            launch(handle)

    reps = []
    for _ in range(repeat):
        ms = stream.time(run, deadline)
        if ms is None:
            return Timing(None, why=f"did not finish within timeout={timeout} s ({len(reps)} of {repeat} repetitions "
                                    "done)")
        reps.append(ms / n)
    q = statistics.quantiles(reps, n=4, method="inclusive") if len(reps) > 1 else [reps[0]] * 3
    return Timing(statistics.median(reps), (q[0], q[2]))
