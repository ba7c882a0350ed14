"""The SASS a cubin holds, as text, through NVIDIA's ``nvdisasm`` (the
``nvidia-cuda-nvdisasm`` wheel: nbjit-core's ``sass`` extra). PTX and fatbins are first
turned into the cubin a device of the given architecture would run."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile

from nbjit.errors import NbjitError, install_hint
from nbjit.files import read_regular

__all__ = ["find_nvdisasm", "disassemble", "cubin_for"]

_INSTALL = (f"install the nvidia-cuda-nvdisasm wheel, which comes with {install_hint('sass')}, "
            "or put CUDA's bin on PATH")
_TIMEOUT_S = 120
# nvdisasm starts each function's code with this line (-c: code sections only)
_SECTION = re.compile(r"^//-+ \.text\.(\S+)\s+-+$", re.M)


@functools.lru_cache(maxsize=None)
def find_nvdisasm() -> str | None:
    """The ``nvdisasm`` executable: the pip wheel's (as cuda.pathfinder finds NVIDIA's tools),
    else one on PATH; None where there is none."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
        exe = find_nvidia_binary_utility("nvdisasm")
    except Exception:  # an older cuda-pathfinder without binary lookup, or none at all
        exe = None
    return exe or shutil.which("nvdisasm")


def disassemble(cubin: bytes, *, kernel: str | None = None, name: str = "<cubin>",
                source: bool = False) -> str:
    """The SASS of a cubin (of one function, ``kernel``, where given) as nvdisasm prints it;
    ``source``: each run of instructions under the source line its line table gives them (a
    cubin compiled with ``-lineinfo`` or ``-G``), as ``// file:line  text``.

    Raises
    ------
    NbjitError: nvdisasm is not installed (saying what to install), refused the cubin, or
    the cubin has no function ``kernel``.
    """
    exe = find_nvdisasm()
    if exe is None:
        raise NbjitError(f"{name}: SASS needs NVIDIA's nvdisasm, which is not installed: {_INSTALL}")
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        try:
            run = subprocess.run([exe, "-c", *(["--print-line-info"] if source else []), path], capture_output=True,
                                 timeout=_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise NbjitError(f"{name}: nvdisasm took more than {_TIMEOUT_S} s") from None
        except OSError as e:
            raise NbjitError(f"{name}: cannot run nvdisasm ({exe}): {e.strerror or e}; {_INSTALL}") from None
    finally:
        os.unlink(path)
    text = run.stdout.decode(errors="replace")
    if run.returncode != 0:
        why = run.stderr.decode(errors="replace").strip().replace(path, name)
        raise NbjitError(f"{name}: nvdisasm could not disassemble it: {why}")
    if source:
        text = with_source(text)
    if kernel is None:
        return text
    functions = _split(text)
    if kernel not in functions:
        raise NbjitError(f"{name}: no function {kernel!r} in the cubin (it has {', '.join(functions) or 'none'})")
    return functions[kernel]


_MAX_SOURCE_BYTES = 64 << 20  # no source file a line table names is this large
# nvdisasm --print-line-info's record before the instructions of a source line
_LINE = re.compile(r'^(\s*)//## File "([^"]+)", line (\d+)(.*)$', re.M)


def with_source(text: str) -> str:
    """nvdisasm's ``--print-line-info`` output with each line record followed by that line
    of the source: read where the record names it, or from this user's copy of a kept source
    (a record naming ``cache.sources``' placeholder); "(not found)" where neither has it."""
    from nbjit.cache.sources import local_path  # (only for SASS with source lines)
    files: dict[str, list[str] | None] = {}

    def lines_of(path: str) -> list[str] | None:
        if path not in files:
            try:  # (a regular file within bounds: a FIFO or device a line table names is never read)
                files[path] = read_regular(local_path(path), _MAX_SOURCE_BYTES).decode("utf-8", "replace").splitlines()
            except (OSError, ValueError):
                files[path] = None
        return files[path]

    def shown(m: re.Match) -> str:
        indent, path, line = m.group(1), m.group(2), int(m.group(3))
        lines = lines_of(path)
        text = lines[line - 1].strip() if lines is not None and 0 < line <= len(lines) else "(not found)"
        short = re.sub(r"/{2,}", "/", path)
        return f"{indent}// {short}:{line}{m.group(4)}  {text}"
    return _LINE.sub(shown, text)


def _split(text: str) -> dict[str, str]:
    """nvdisasm's output cut into {function: its code}."""
    heads = list(_SECTION.finditer(text))
    return {m.group(1): text[m.start(): heads[i + 1].start() if i + 1 < len(heads) else len(text)].rstrip() + "\n"
            for i, m in enumerate(heads)}


def cubin_for(image, arch: str | None = None) -> bytes:
    """The cubin a device of ``arch`` runs for ``image`` (an ``Image`` or what ``as_image``
    takes): a cubin as it is; a fatbin's entry for ``arch`` (its PTX assembled where it has
    no SASS for it); PTX assembled with nvJitLink. ``arch`` is needed for PTX and fatbins.

    Raises
    ------
    NbjitError: no ``arch`` where one is needed, or no entry of a fatbin runs on it.
    """
    from nbjit.read.image import as_image

    img = as_image(image)
    if img.kind == "cubin":
        return bytes(img.data)
    if arch is None:
        raise NbjitError(f"{img.name}: {img.kind} holds no SASS of its own: give the architecture to show SASS for "
                         "(arch='sm_90'; nbjit inspect --sass --arch sm_90)")
    if img.kind == "fatbin":
        from nbjit.read.fatbin import inspect_fatbin, undecoded
        entry = inspect_fatbin(img.data, source=img.name).select(arch)
        if entry is None or entry.payload is None:
            why = "" if entry is None else f": the one for it, {entry.arch_name}, is {undecoded(entry)}"
            raise NbjitError(f"{img.name}: no readable entry of the fatbin runs on {arch}{why}")
        if entry.kind == "cubin":
            return bytes(entry.payload)
        ptx = entry.payload
    else:
        ptx = img.data
    from nbjit.arch import Arch
    from nbjit.toolchain.nvjitlink import assemble_cached
    try:
        a = Arch.parse(arch.strip() if isinstance(arch, str) else arch)
    except ValueError as e:
        raise NbjitError(f"{img.name}: {e}") from None
    text = ptx.decode(errors="replace").rstrip("\0") if isinstance(ptx, (bytes, bytearray)) else ptx
    return assemble_cached(text, a.real(), name=img.name)
