"""Device functions nbjit gives ``@cuda.jit`` kernels, declared to the Numba nbjit serves
(numba-cuda or numba-cuda-mlir) when this module is first imported (``nbjit.set_condition``):

``set_condition(handle, value)``: set a graph condition (``nbjit.capture``'s ``g.condition()``;
the kernel takes it as a ``uint64``) to ``value``; the conditional node that reads it
(``g.while_loop``, ``g.if_then``, ``g.if_else``, ``g.switch``) decides on it when it runs.
Call it from one thread (``if cuda.grid(1) == 0:``): concurrent calls race."""
from __future__ import annotations

from nbjit.gpu.host import current_host

__all__ = ["set_condition"]

set_condition = current_host().set_condition()
