"""Graph programs on a GPU (marker `gpu`): conditional nodes (while_loop, if_then, if_else,
switch; nested; several conditions) whose conditions CUDA C++ and @cuda.jit kernels set;
bodies mixing @cuda.jit and C++ kernels with a memset and a copy; node updates in place;
and what is refused, each with one clear error."""
from __future__ import annotations

import numpy as np
import pytest

import nbjit
from nbjit import NbjitGraphError

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:(Grid size|Host array used):Warning")]

N = 256
CPP = r'''
extern "C" __global__ void countdown(int* left, cudaGraphConditionalHandle again) {
    if (threadIdx.x == 0 && blockIdx.x == 0) { int v = --left[0]; cudaGraphSetConditional(again, v > 0); }
}
extern "C" __global__ void add(float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a;
}
extern "C" __global__ void choose(const int* which, cudaGraphConditionalHandle c) {
    if (threadIdx.x == 0 && blockIdx.x == 0) cudaGraphSetConditional(c, which[0]);
}
'''


@pytest.fixture(scope="module")
def kit(cuda):
    set_condition = nbjit.set_condition

    @cuda.jit
    def halve_until(x, limit, again):  # x[0] halves each pass; `again` stays set while x[0] > limit
        if cuda.grid(1) == 0:
            x[0] = x[0] / 2
            set_condition(again, x[0] > limit)

    @cuda.jit
    def scale(y, a):
        i = cuda.grid(1)
        if i < y.shape[0]:
            y[i] *= a

    @cuda.jit
    def count(c):
        if cuda.grid(1) == 0:
            c[0] += 1

    @cuda.jit
    def halve_until_if(x, limit, again, on):  # (for Numba's own launch: warmed up with on=0, outside a graph)
        if cuda.grid(1) == 0 and on:
            x[0] = x[0] / 2
            set_condition(again, x[0] > limit)

    m = nbjit.compile(CPP, name="graph_programs.cu")
    halve = nbjit.from_numba(halve_until, "void(float32[::1], float32, uint64)")
    halve_until_if[1, 1](cuda.device_array(1, np.float32), np.float32(1), np.uint64(0), np.int32(0))
    cuda.synchronize()  # compiled and loaded now: a capture cannot load a module
    scale_k = nbjit.from_numba(scale, "void(float32[::1], float32)")
    count_k = nbjit.from_numba(count, "void(int32[::1])")
    return {"countdown": m["countdown"], "add": m["add"], "choose": m["choose"], "halve": halve,
            "halve_numba": halve_until_if, "scale": scale_k, "count": count_k}


def countdown_loop(cuda, kit, passes: int):
    """A loop adding 1 to y per pass, a C++ kernel counting the passes down: (graph, y, left, stream)."""
    s = cuda.stream()
    left = cuda.to_device(np.array([passes], np.int32))
    y = cuda.to_device(np.zeros(N, np.float32))
    with nbjit.capture(s) as g:
        again = g.condition(default=1)
        with g.while_loop(again):
            kit["add"][1, N, s](y, 1.0, N)
            kit["countdown"][1, 1, s](left, again)
    return g, y, left, s


def test_while_loop_condition_set_by_cpp_kernel(cuda, kit):
    g, y, left, s = countdown_loop(cuda, kit, 5)
    assert g.node_count == 3 and [n.name for n in g.nodes] == ["add", "countdown"]
    assert [n.path for n in g.nodes] == [(0, 0), (0, 0)]
    g.launch()
    s.synchronize()
    assert (y.copy_to_host() == 5).all() and left.copy_to_host()[0] == 0
    left.copy_to_device(np.array([3], np.int32))
    g.launch()  # reset=True: the loop runs again from its default
    s.synchronize()
    assert (y.copy_to_host() == 8).all()


@pytest.mark.parametrize("launcher", ["nbjit", "numba"])
def test_while_loop_condition_set_by_cuda_jit_kernel(cuda, kit, launcher):
    s = cuda.stream()
    x = cuda.to_device(np.array([1024.0], np.float32))
    with nbjit.capture(s) as g:
        again = g.condition(default=1)
        with g.while_loop(again):
            if launcher == "nbjit":
                kit["halve"][1, 1, s](x, 1.0, again)
            else:  # Numba's own launch: the handle as an int
                kit["halve_numba"][1, 1, s](x, np.float32(1.0), np.uint64(again.handle), np.int32(1))
    g.launch()
    s.synchronize()
    assert x.copy_to_host()[0] == 1.0  # 1024 halved 10 times, in one replay


def test_if_then_if_else_switch_with_mixed_bodies(cuda, kit):
    s = cuda.stream()
    which = cuda.to_device(np.array([1], np.int32))
    y = cuda.to_device(np.ones(N, np.float32))
    z = cuda.device_array(N, np.float32)
    c = cuda.to_device(np.zeros(1, np.int32))
    from nbjit.gpu.host import current_host
    device_memset = current_host().module("driver").device_memset
    with nbjit.capture(s) as g:
        pick = g.condition()
        kit["choose"][1, 1, s](which, pick)
        with g.switch(pick, 3) as cases:
            with cases[0]:
                kit["add"][1, N, s](y, 100.0, N)
            with cases[1]:  # @cuda.jit + C++ + a copy
                kit["scale"][1, N, s](y, 3.0)
                kit["add"][1, N, s](y, 1.0, N)
                z.copy_to_device(y, stream=s)
            with cases[2]:
                device_memset(y, 0, y.nbytes, stream=s)
        yes = g.condition(default=1)
        with g.if_then(yes):
            kit["count"][1, 1, s](c)
        no = g.condition(default=0)
        with g.if_else(no) as (then, otherwise):
            with then:
                kit["add"][1, N, s](z, 1000.0, N)
            with otherwise:
                kit["scale"][1, N, s](z, 2.0)
    g.launch()
    s.synchronize()
    assert (y.copy_to_host() == 4).all() and (z.copy_to_host() == 8).all() and c.copy_to_host()[0] == 1
    which.copy_to_device(np.array([2], np.int32))
    g.launch()  # case 2: the memset
    s.synchronize()
    assert not y.copy_to_host().any() and c.copy_to_host()[0] == 2


def test_nested_loops(cuda, kit):
    s = cuda.stream()
    outer_left = cuda.to_device(np.array([3], np.int32))
    inner_left = cuda.to_device(np.array([4], np.int32))
    reset4 = cuda.to_device(np.array([4], np.int32))
    c = cuda.to_device(np.zeros(1, np.int32))
    one = cuda.to_device(np.array([1], np.int32))
    with nbjit.capture(s) as g:
        outer = g.condition(default=1)
        with g.while_loop(outer):
            inner_left.copy_to_device(reset4, stream=s)
            inner = g.condition()  # (its default applies when the graph is launched: set it for each pass)
            kit["choose"][1, 1, s](one, inner)
            with g.while_loop(inner):
                kit["count"][1, 1, s](c)
                kit["countdown"][1, 1, s](inner_left, inner)
            kit["countdown"][1, 1, s](outer_left, outer)
    g.launch()
    s.synchronize()
    assert c.copy_to_host()[0] == 12
    assert len(g.conditions) == 2 and g.node_count == 7


def test_node_updates_in_place(cuda, kit):
    s = cuda.stream()
    y = cuda.to_device(np.zeros(N, np.float32))
    y2 = cuda.to_device(np.zeros(N, np.float32))
    with nbjit.capture(s) as g:
        kit["add"][1, N, s](y, 1.0, N)
        kit["scale"][1, N, s](y, 2.0)
    add, scale = g.nodes["add"], g.nodes[1]
    g.launch()
    s.synchronize()
    assert (y.copy_to_host() == 2).all()
    add.set_args(y2, 5.0, N)  # another array, another scalar
    scale.set_args(y2, 3.0)
    g.launch()
    s.synchronize()
    assert (y2.copy_to_host() == 15).all() and (y.copy_to_host() == 2).all()
    scale.disable()
    g.launch()
    s.synchronize()
    assert (y2.copy_to_host() == 20).all()
    scale.enable()
    add.set_grid(1, 64)  # only the first 64 elements now
    g.launch()
    s.synchronize()
    out = y2.copy_to_host()
    assert (out[:64] == 75).all() and (out[64:] == 60).all()
    with pytest.raises(nbjit.NbjitArgumentError):
        add.set_args(cuda.device_array(N, np.float64), 1.0, N)  # checked like a launch
    with pytest.raises(NbjitGraphError, match="graph nodes run kernel 'nothing'"):
        g.nodes["nothing"]


def test_node_update_in_a_loop_body(cuda, kit):
    g, y, _left, s = countdown_loop(cuda, kit, 2)
    g.nodes["add"].set_args(y, 10.0, N)
    g.launch()
    s.synchronize()
    assert (y.copy_to_host() == 20).all()


def test_what_conditions_refuse(cuda, kit):
    s = cuda.stream()
    left = cuda.to_device(np.array([1], np.int32))
    with nbjit.capture(s) as g:
        again = g.condition(default=1)
        with g.while_loop(again):
            kit["countdown"][1, 1, s](left, again)
    with pytest.raises(NbjitGraphError, match="outside its graph"):
        kit["countdown"][1, 1, s](left, again)  # an eager launch
    s2 = cuda.stream()
    with pytest.raises(NbjitGraphError, match="belongs to another capture"):
        with nbjit.capture(s2) as g2:
            with g2.while_loop(again):
                pass
    with pytest.raises(NbjitGraphError, match="inside `with nbjit.capture"):
        g.while_loop(again).__enter__()
    with pytest.raises(NbjitGraphError, match="goes in a body"):
        with nbjit.capture(s2) as g3:
            c = g3.condition()
            with g3.if_else(c) as (then, otherwise):
                g3.condition()
    y = cuda.to_device(np.zeros(N, np.float32))
    with pytest.raises(NbjitGraphError, match="work was issued between the bodies of if_else"):
        with nbjit.capture(s2) as g4:
            c = g4.condition()
            with g4.if_else(c) as (then, otherwise):
                with then:
                    kit["add"][1, N, s2](y, 1.0, N)
                kit["add"][1, N, s2](y, 5.0, N)  # in no body
    with pytest.raises(NbjitGraphError, match="was recorded already"):
        with nbjit.capture(s2) as g5:
            c = g5.condition()
            with g5.if_else(c) as (then, otherwise):
                with then:
                    pass
                with then:
                    pass
    s2.synchronize()
    assert not y.copy_to_host().any()  # nothing ran


def test_a_body_that_synchronises_is_refused_and_the_stream_stays_usable(cuda, kit):
    s = cuda.stream()
    y = cuda.to_device(np.zeros(N, np.float32))
    with pytest.raises(NbjitGraphError, match="the body of while_loop.*(synchronous copy|default stream)"):
        with nbjit.capture(s) as g:
            again = g.condition(default=0)
            with g.while_loop(again):
                kit["add"][1, N, s](y, 1.0, N)
                y.copy_to_host()  # synchronous
    from nbjit.gpu import graphs
    from nbjit.gpu.driver import stream_handle
    assert graphs.capture_status(stream_handle(s)) == "none"
    kit["add"][1, N, s](y, 1.0, N)
    s.synchronize()
    assert (y.copy_to_host() == 1).all()  # nothing of the capture ran
