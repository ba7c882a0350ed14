"""What a ``Host`` does off a package's first kernel, apart from ``_host.py`` so that a kernel
bundle's first kernel does not read it (issue 26): the messages of a host that is not
installed, of a context Numba could not make, of a host's name asked for that is not one or
too late, of both hosts imported; a dispatcher's options and its types as nbjit passes them;
a Python device function compiled to LTO-IR; the owner a numba-cuda-mlir array keeps. The
hosts, their names and the environment variable are handed in (this imports no ``_host``)."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from nbjit.errors import NbjitHostError, NbjitLoadError, install_hint


def not_installed(host: Any, hosts: Sequence[Any], env: str) -> NbjitLoadError:
    """The error for ``host``'s package not installed (``hosts``: the others to choose from)."""
    return NbjitLoadError(
        f"nbjit loads and launches in the context of a Numba, and {host.name} (the one it serves "
        f"in this process) is not installed: install {install_hint(host.extra)}; or choose another "
        f"with {env} / nbjit.use_host() ({', '.join(repr(h.name) for h in hosts)})")


def context_error(e: Exception) -> NbjitLoadError:
    """The error for the host's ``cuda.current_context()`` raising ``e``, told in one line."""
    # its first line, or two where the first only introduces the second ("Error at driver init:")
    lines = [line.strip() for line in str(e).splitlines() if line.strip(": \t")]
    first = " ".join(lines[:2] if lines and lines[0].endswith(":") else lines[:1]) or type(e).__name__
    if "non-primary" in first:  # a context someone else created is current on this thread
        return NbjitLoadError(
            f"the CUDA context current on this thread is not a device's primary context ({first[:200]}), "
            "and Numba, whose context nbjit loads into, works only in those: pop that context "
            "(cuCtxPopCurrent) before using nbjit or Numba in this thread")
    return NbjitLoadError(
        f"no usable CUDA GPU or driver ({first[:200]}): loading and launching need one; nbjit can still "
        "inspect, strip and compile (give compile an explicit arch=, e.g. 'sm_90')")


def not_a_host(name: str, hosts: Sequence[Any], where: str) -> NbjitHostError:
    """The error for ``name``, asked for ``where``, naming none of ``hosts``."""
    return NbjitHostError(f"{where}: {name!r} is not a host nbjit serves; the names are "
                          f"{', '.join(repr(h.name) for h in hosts)}")


def not_a_name(name: Any, hosts: Sequence[Any]) -> NbjitHostError:
    """The error for ``nbjit.use_host(name)`` given something other than a name."""
    return NbjitHostError(f"nbjit.use_host takes a host's name ({', '.join(repr(x.name) for x in hosts)}), "
                          f"not {type(name).__name__}")


def serving_already(name: str, serving: Any, env: str) -> NbjitHostError:
    """The error for ``nbjit.use_host(name)`` where host ``serving`` was chosen already."""
    return NbjitHostError(
        f"nbjit.use_host({name!r}): nbjit serves {serving.name} in this process already (chosen at its "
        f"first use, which loads into that host's context); call use_host before nbjit loads, compiles or "
        f"launches anything, or set {env}={name} in the environment")


def both_imported(serving: Any, imported: Sequence[str], hosts: Sequence[Any], env: str) -> str:
    """The warning where the packages of the hosts called ``imported`` are imported, none
    was named, and ``serving`` was chosen."""
    other = next(x.name for x in hosts if x is not serving)
    return (f"both {' and '.join(imported)} are imported: nbjit serves {serving.name} (it loads into its "
            f"context, and DeviceGlobal.as_array and Triton's scratch buffers are its arrays; either's "
            f"arrays and streams launch, and from_numba takes either's kernels). To serve {other}, "
            f"set {env}={other} or call nbjit.use_host({other!r}) before nbjit's first use")


def describe_type(host: Any, t: Any) -> tuple | None:
    """``Host.describe_type``: a Numba type of ``host``'s as nbjit passes it."""
    types, as_dtype = host.module("types"), host.module("numpy_support").as_dtype
    if isinstance(t, types.Array):
        return ("array", as_dtype(t.dtype), t.ndim, t.layout, not t.mutable)
    if isinstance(t, (types.Integer, types.Float, types.Boolean, types.Complex)):
        return ("scalar", as_dtype(t))
    return None


def ptx_options(targetoptions: Mapping[str, Any]) -> dict[str, Any]:
    """``Host.ptx_options``: what of a numba-cuda dispatcher's options ``compile_ptx`` takes again."""
    out: dict[str, Any] = {"fastmath": bool(targetoptions.get("fastmath", False)),
                           "lineinfo": bool(targetoptions.get("lineinfo", False))}
    if targetoptions.get("launch_bounds") is not None:
        out["launch_bounds"] = targetoptions["launch_bounds"]
    if targetoptions.get("opt") is not None:
        out["opt"] = bool(targetoptions["opt"])
    return out


def mlir_ptx_options(targetoptions: Mapping[str, Any]) -> dict[str, Any]:
    """``NumbaCudaMlir.ptx_options``: as numba-cuda's, with ``opt_level`` (0 to 3) for ``opt``
    (0: off; 1 to 3: on, as level 3)."""
    out = ptx_options({k: v for k, v in targetoptions.items() if k != "opt"})
    level = targetoptions.get("opt_level")
    if level is not None:
        out["opt"] = int(level) > 0
    return out


def compile_ltoir(host: Any, func: Callable, args: Sequence, ret: Any, name: str,
                  cc: tuple[int, int]) -> tuple[bytes, Any]:
    """``Host.compile_ltoir``: (LTO-IR, return type) of a Python device function compiled by
    ``host`` with the C ABI as the function ``name``."""
    py = getattr(func, "py_func", func)
    opts = dict(getattr(func, "targetoptions", None) or {})
    code, resty = host.module("cuda").compile(
        py, tuple(args) if ret is None else ret(*args), device=True, abi="c", abi_info={"abi_name": name},
        output="ltoir", cc=cc, fastmath=bool(opts.get("fastmath", False)),
        lineinfo=bool(opts.get("lineinfo", False)), debug=bool(opts.get("debug", False)), opt=opts.get("opt", True))
    return bytes(code), resty


class Keeper:
    """Keeps an object alive as a host array's owner, with nothing else to read."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj
