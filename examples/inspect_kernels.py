"""Inspect the kernels of a PTX file (default: nbjit's nvcc fixture) and strip its debug info.

    python examples/inspect_kernels.py [FILE.ptx]
"""
import sys
from pathlib import Path

import nbjit

path = Path(sys.argv[1]) if len(sys.argv) > 1 else \
    Path(__file__).resolve().parent.parent / "tests/data/nvcc/kernels_G_sm90.ptx"
try:
    info = nbjit.inspect_ptx(path.read_bytes(), source=str(path))  # (bytes: a cubin is named as one)
except (OSError, nbjit.NbjitError) as e:  # one line, status 2 (nbjit inspect FILE reads any image)
    print(f"inspect_kernels.py: {f'cannot read {path}: {e.strerror}' if isinstance(e, OSError) else e}",
          file=sys.stderr)
    sys.exit(2)
text = path.read_text()
print(f"{path.name}: PTX {info.version[0]}.{info.version[1]} for {info.arch}, {len(info.entries)} kernels, "
      f"debug info: {info.debug.kind}")
for k in info.entries:
    params = ", ".join(f"{p.type}{'[%d]' % p.count if p.count else ''}@{p.offset}" for p in k.params)
    print(f"  {k.name}({params})  {k.param_size} bytes  {k.directives.to_json() or ''}")
stripped = nbjit.strip_debug(text)
after = nbjit.inspect_ptx(stripped)
assert after.debug.kind == "none" and [e.name for e in after.entries] == [e.name for e in info.entries]
print(f"stripped: {len(text)} -> {len(stripped)} bytes, debug info now: {after.debug.kind}")
