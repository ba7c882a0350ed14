"""nbjit's exceptions: one hierarchy, and each crosses a process boundary whole."""
from __future__ import annotations

import pickle

import pytest

import nbjit
from nbjit import errors


def _all_error_types() -> list[type]:
    import importlib
    import pkgutil
    for m in pkgutil.iter_modules(nbjit.__path__):
        if m.name not in ("__main__",):
            importlib.import_module(f"nbjit.{m.name}")
    out, todo = [], [errors.NbjitError]
    while todo:
        t = todo.pop()
        out.append(t)
        todo.extend(t.__subclasses__())
    return out


def _example(t: type) -> BaseException:
    if t is errors.CompileFailure:
        return t("k.cu", "int x\n", ["-arch=sm_90"], 'k.cu(1): error: expected a ";"', "NVRTC 13.5", "hint: ...")
    if issubclass(t, errors.PtxParseError):
        return t("unknown directive .entyr", source="k.ptx", line=7)
    e = t(f"{t.__name__}: what was wrong, and what would be right")
    e.extra = {"kernel": "k", "names": ["a", "b"]}  # attributes travel too
    return e


def test_every_error_type_pickles_equal():
    """CompileFailure did not unpickle (__init__() missing 4 required positional arguments):
    a spawn pool broke and NVRTC's log was lost; PtxParseError unpickled with its place
    doubled. Every type now comes back with its message and attributes."""
    types = _all_error_types()
    assert len(types) >= 12
    for t in types:
        e = _example(t)
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is t and str(back) == str(e) and back.args == e.args, t
        assert back.__dict__ == e.__dict__, t
    f = pickle.loads(pickle.dumps(_example(errors.CompileFailure)))
    assert f.log.startswith("k.cu(1)") and f.source_with_line_numbers() == "    1 | int x"


def _compile_bad(_=None):
    import nbjit
    from nbjit.cache.store import Cache
    return nbjit.compile_image('extern "C" __global__ void k() { undefined_thing; }', name="bad.cu", arch="sm_90",
                               cache=Cache(None))


def test_a_compile_error_in_a_spawn_worker_reaches_the_parent():
    """In a spawn ProcessPoolExecutor the pool broke (BrokenProcessPool) and
    multiprocessing.Pool.apply hung; the error now arrives with NVRTC's log."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        with pytest.raises(nbjit.CompileFailure) as e:
            pool.submit(_compile_bad).result(timeout=120)
        assert 'identifier "undefined_thing" is undefined' in e.value.log and e.value.name == "bad.cu"
        assert ">    1 | extern" in str(e.value)
    with ctx.Pool(1) as pool:
        with pytest.raises(nbjit.CompileFailure, match="undefined_thing"):
            pool.apply_async(_compile_bad).get(timeout=120)


def test_a_warning_names_the_users_line_however_deep_nbjit_ran(tmp_path):
    """``errors.warn`` skips nbjit's own frames: the warning of a compile that made no kernel
    names the line that called ``compile_image``, and that of a link input reached through
    ``link_image``'s helpers the line that called ``link_image``."""
    import warnings
    no_kernel = "__device__ float twice(float x) { return 2 * x; }\n"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        nbjit.compile_image(no_kernel, arch="sm_90", cache=nbjit.Cache(tmp_path))
        line = __import__("inspect").currentframe().f_lineno - 1
    ours = [x for x in w if issubclass(x.category, nbjit.NbjitWarning)]
    assert [(x.filename, x.lineno) for x in ours] == [(__file__, line)], [str(x.message) for x in ours]
    (tmp_path / "h.cuh").write_text("\n")
    (tmp_path / "op.cu").write_text('#define H "h.cuh"\n#include H\n'
                                    'extern "C" __device__ float op(float x) { return x; }\n')
    main = 'extern "C" __device__ float op(float);\nextern "C" __global__ void k(float* y) { y[0] = op(y[0]); }\n'
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        nbjit.link_image(main, [str(tmp_path / "op.cu")], arch="sm_90", cache=nbjit.Cache(tmp_path / "c"))
        line = __import__("inspect").currentframe().f_lineno - 1
    ours = [x for x in w if issubclass(x.category, nbjit.NbjitWarning)]
    assert ours and {(x.filename, x.lineno) for x in ours} == {(__file__, line)}, [str(x.message) for x in ours]


@pytest.mark.parametrize("bridge, needs", [("torch", "PyTorch"), ("jax", "JAX")])
def test_a_framework_bridge_without_its_framework_says_what_to_install(bridge, needs):
    import subprocess
    import sys
    from pathlib import Path
    code = f"import sys; sys.modules[{bridge!r}] = None\nimport nbjit\nnbjit.{bridge}"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).parent.parent)
    assert r.returncode == 1 and f"NbjitError: nbjit.{bridge} needs {needs} (pip install" in r.stderr, r.stderr
