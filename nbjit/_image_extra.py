"""What ``image.sniff`` says of bytes that are no image the driver loads (what they are, and
what to do instead), apart from ``image.py`` so that a kernel bundle's first kernel does not
read it (issue 26); imports no ``image``."""
from __future__ import annotations

import re

from nbjit.errors import ImageFormatError

_SAID = {
    "empty": "empty image",
    "host ELF": "an ELF file for the host, not a cubin: nbjit does not read host objects or libraries; extract "
                "their device code with 'cuobjdump -xelf all' or '-xptx all'",
    "truncated ELF": "a truncated ELF file (shorter than an ELF header): not a whole cubin",
    "fatbin wrapper": "a host-side fatbin wrapper (.nvFatBinSegment), not the fatbin itself",
    "LTO-IR": "NVVM LTO-IR (from -dlto), which the driver cannot load: link it to a cubin (nbjit.compile(source, "
              "link=[it]) or nbjit.link_image), or compile without -dlto to get PTX or a cubin",
    "bitcode": "LLVM bitcode (NVVM IR), which the driver cannot load: compile it to PTX with libNVVM or llc first",
}


def not_an_image(what: str, data: bytes, name: str) -> ImageFormatError:
    """The error for ``data`` (called ``name``) that ``sniff`` found to be ``what``: one of
    ``_SAID``'s, "binary" (other binary data) or "text" (text that is not PTX)."""
    said = _SAID.get(what)
    if said is not None:
        return ImageFormatError(f"{name}: {said}")
    if what == "binary" and bytes(data[:4]) == b"PK\x03\x04":
        return ImageFormatError(f"{name}: a ZIP archive (a kernel bundle?), not a kernel image: load a bundle with "
                                "nbjit.load_bundle, read it with 'nbjit inspect'")
    if what == "binary":
        return ImageFormatError(f"{name}: binary data that is neither PTX, a cubin (ELF) nor a fatbin "
                                f"(starts with {bytes(data[:8]).hex(' ')})")
    sample = bytes(data[: 1 << 16])
    if re.search(rb"__global__|#include", sample):
        return ImageFormatError(f"{name}: CUDA C++ source, not compiled code: compile it first "
                                "(nbjit.compile(), or 'nbjit compile FILE --arch sm_XX')")
    if re.search(rb"^(?:target (?:triple|datalayout)|define |; ModuleID)", sample, re.M):
        return ImageFormatError(f"{name}: LLVM IR text, which the driver cannot load: compile it to PTX first")
    return ImageFormatError(f"{name}: not PTX (no '.version' directive), a cubin or a fatbin")
