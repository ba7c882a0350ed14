"""Which host nbjit serves (nbjit.gpu.host): named (NBJIT_HOST, nbjit.use_host), else the
Numba the user imported (numba-cuda where both are, said in a warning), else the first
installed, else the bare host (no Numba). No Numba is imported here (fresh processes check the
real choice), so this runs in every environment, the CI leg without numba-cuda included."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nbjit import NbjitHostError, NbjitLoadError
from nbjit.gpu.host import ENV, HOSTS, Bare, Host, NumbaCuda, NumbaCudaMlir, choose, host_of

CUDA, MLIR, BARE = HOSTS


class Other(Host):
    name, package, top = "other", "other_numba.cuda", "other_numba"


def test_the_hosts_and_their_packages():
    assert [h.name for h in HOSTS] == ["numba-cuda", "numba-cuda-mlir", "bare"]
    assert isinstance(CUDA, NumbaCuda) and isinstance(MLIR, NumbaCudaMlir) and isinstance(BARE, Bare)
    assert BARE.installed() and BARE.package == "" and BARE.imported("cuda") is None and not BARE.owns(CUDA)
    assert (CUDA.package, MLIR.package) == ("numba.cuda", "numba_cuda_mlir")
    assert (CUDA.abi, MLIR.abi) == ("numba", "mlir") and (CUDA.extra, MLIR.extra) == ("numba", "mlir")
    assert all(m.startswith("numba_cuda_mlir.") for m in MLIR.modules.values())
    assert not any(m.startswith("numba_cuda_mlir") for m in CUDA.modules.values())


def test_the_one_imported_serves():
    everything = lambda h: True  # noqa: E731
    assert choose(HOSTS, {"sys", "numba_cuda_mlir"}, installed=everything) is MLIR
    assert choose(HOSTS, {"sys", "numba", "numba.cuda"}, installed=everything) is CUDA
    assert choose(HOSTS, {"numba.cuda", "numba_cuda_mlir"}, installed=everything) is CUDA  # both: numba-cuda
    assert choose(HOSTS, {"numba"}, installed=everything) is CUDA  # (numba without numba.cuda: not imported)


def test_nothing_imported_the_first_installed_serves():
    assert choose(HOSTS, {"sys"}, installed=lambda h: True) is CUDA
    assert choose(HOSTS, {"sys"}, installed=lambda h: h is MLIR) is MLIR  # numba-cuda not installed
    assert choose(HOSTS, {"sys"}, installed=lambda h: h is BARE) is BARE  # no Numba installed: the bare host
    assert choose(HOSTS, {"sys", ""}, installed=lambda h: h is BARE) is BARE  # (its empty package is never imported)
    first, other = NumbaCuda(), Other()
    assert choose((first, other), {"sys", "other_numba.cuda"}) is other
    assert choose((first, other), {"sys"}, installed=lambda h: h is other) is other


def test_a_named_host_serves_whatever_was_imported():
    assert choose(HOSTS, {"numba.cuda"}, "numba-cuda-mlir") is MLIR
    assert choose(HOSTS, {"numba_cuda_mlir"}, "numba-cuda") is CUDA
    assert choose(HOSTS, {"numba.cuda"}, "bare") is BARE
    with pytest.raises(NbjitHostError, match=r"NBJIT_HOST=mlir: 'mlir' is not a host nbjit serves; the names are "
                                             r"'numba-cuda', 'numba-cuda-mlir', 'bare'"):
        choose(HOSTS, (), "mlir")


def test_whose_dispatcher_it_is():
    mlir_kind = type("MLIRDispatcher", (), {"__module__": "numba_cuda_mlir.descriptor"})
    cuda_kind = type("CUDADispatcher", (), {"__module__": "numba.cuda.dispatcher"})
    assert host_of(mlir_kind()) is MLIR and host_of(cuda_kind()) is CUDA
    assert MLIR.owns(mlir_kind()) and not CUDA.owns(mlir_kind()) and not MLIR.owns(cuda_kind())


def test_the_mlir_hosts_options_for_compile_ptx():
    """numba-cuda-mlir keeps opt_level (0-3); compile_ptx takes opt (0: off, else level 3)."""
    opts = {"fastmath": True, "lineinfo": False, "opt": True, "opt_level": 0, "launch_bounds": (128, 2),
            "link": [], "chip": "sm_90"}
    assert MLIR.ptx_options(opts) == {"fastmath": True, "lineinfo": False, "launch_bounds": (128, 2), "opt": False}
    assert MLIR.ptx_options({"opt_level": 2}) == {"fastmath": False, "lineinfo": False, "opt": True}
    assert CUDA.ptx_options({"fastmath": False, "opt": True, "lineinfo": True}) == \
        {"fastmath": False, "lineinfo": True, "opt": True}


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, its environment with ``env`` (and no NBJIT_HOST
    unless given)."""
    e = {k: v for k, v in os.environ.items() if k != ENV}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)


def test_use_host_chooses_once_importing_nothing():
    code = ("import sys, nbjit\n"
            "h = nbjit.use_host('numba-cuda-mlir')\n"
            "from nbjit.gpu.host import current_host\n"
            "print(h.name, current_host() is h, nbjit.use_host('numba-cuda-mlir') is h)\n"
            "for bad in ('numba-cuda', 'cupy', 3):\n"
            "    try:\n"
            "        nbjit.use_host(bad)\n"
            "    except nbjit.NbjitHostError as e:\n"
            "        print(type(e).__name__, '|', e)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'numba_cuda_mlir')))\n")
    r = run(code)
    lines = r.stdout.splitlines()
    assert lines[0] == "numba-cuda-mlir True True", r.stdout + r.stderr
    assert lines[1].startswith("NbjitHostError | nbjit.use_host('numba-cuda'): nbjit serves numba-cuda-mlir in this "
                               "process already"), lines[1]
    assert "set NBJIT_HOST=numba-cuda in the environment" in lines[1]
    assert lines[2] == ("NbjitHostError | nbjit.use_host: 'cupy' is not a host nbjit serves; the names are "
                        "'numba-cuda', 'numba-cuda-mlir', 'bare'")
    assert lines[3] == ("NbjitHostError | nbjit.use_host takes a host's name ('numba-cuda', 'numba-cuda-mlir', "
                        "'bare'), not int")
    assert lines[4] == "[]"


def test_the_environment_names_the_host():
    code = "from nbjit.gpu.host import current_host\nprint(current_host().name)"
    assert run(code, NBJIT_HOST="numba-cuda-mlir").stdout == "numba-cuda-mlir\n"
    assert run(code, NBJIT_HOST="numba-cuda").stdout == "numba-cuda\n"
    assert run(code, NBJIT_HOST="bare").stdout == "bare\n"
    r = run(code, NBJIT_HOST="numba")
    assert "NbjitHostError: NBJIT_HOST=numba: 'numba' is not a host nbjit serves" in r.stderr, r.stderr


def test_a_host_not_installed_says_what_to_install():
    """Asked for its context, a host whose package is missing names the extra that brings it."""
    ghost = Other()
    ghost.modules = {"cuda": "other_numba.cuda"}
    ghost.extra = "other"
    with pytest.raises(NbjitLoadError, match=r"other \(the one it serves in this process\) is not installed: "
                                             r"install nbjit-core's 'other' extra: "
                                             r"pip install -e '\.\[other\]' in a checkout"):
        ghost.current_context()
    assert not ghost.installed()
