"""The package's layering holds: no import cycle among nbjit's modules (lazy imports inside
functions included), and only _driver.py (with the C launch path it sets up) calls the CUDA
driver. Read from the source, no import needed."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "nbjit"
MODULES = {p.stem: p for p in PKG.glob("*.py")}


def _imports(path: Path) -> set[str]:
    """nbjit modules ``path`` imports, at module level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                out.add(node.module.split(".")[0])
            elif node.level == 1:  # from . import x
                out.update(a.name for a in node.names)
            elif node.module and node.module.startswith("nbjit."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("nbjit."))
    return {m for m in out if m in MODULES and m != path.stem}


GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def test_no_import_cycles():
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for n in sorted(GRAPH[m]):
            if seen.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in seen:
                visit(n, path + [n])
        seen[m] = 2

    for m in sorted(GRAPH):
        if m not in seen:
            visit(m, [m])


def test_readers_do_not_reach_for_the_gpu():
    """The stages before loading are pure data: none of them imports the driver stage."""
    pure = ["arch", "cdecl", "ptx", "cubin", "_elf", "fatbin", "image", "signature", "errors", "cache", "loader"]
    for m in pure:
        assert not GRAPH[m] & {"_driver", "kernel", "module", "triton"}, (m, GRAPH[m])


def test_only_the_driver_module_calls_the_driver():
    """cuda.bindings' driver API (cuLaunchKernel, cuModuleLoadDataEx, ...) is called from
    _driver.py alone; numba's context and device objects are reached through it too."""
    for name, path in MODULES.items():
        if name == "_driver":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("cuda.bindings", "cuda.bindings.driver"):
                assert all(a.name != "driver" for a in node.names) or node.module != "cuda.bindings", \
                    f"{name}.py imports cuda.bindings.driver"
                assert node.module != "cuda.bindings.driver", f"{name}.py imports cuda.bindings.driver"
            if isinstance(node, ast.Attribute) and node.attr.startswith("cu") and node.attr[2:3].isupper():
                raise AssertionError(f"{name}.py:{node.lineno} calls the driver ({node.attr})")
            via_driver = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id == "_driver"
            if isinstance(node, ast.Attribute) and node.attr in ("current_context", "get_current_device") \
                    and not via_driver:
                raise AssertionError(f"{name}.py:{node.lineno} reaches numba's context ({node.attr}); use _driver")


def test_import_nbjit_loads_what_is_used():
    """`import nbjit` took 0.55-0.7 s, importing every stage and numpy: it now imports its
    errors only, each public name loads its module on first use, and compiling for a given
    architecture or inspecting never imports numpy, Numba or the driver module."""
    import subprocess
    import sys
    code = """
import sys, nbjit
mods = lambda: sorted(m for m in sys.modules if m.startswith("nbjit.") or m in ("numpy", "numba", "nbjit._driver"))
print(mods())
nbjit.inspect_ptx; nbjit.strip_debug; nbjit.inspect_cubin; nbjit.compile_image; nbjit.Cache
print("numpy" in sys.modules, "numba" in sys.modules, "nbjit._driver" in sys.modules)
from nbjit import *
import nbjit as n
print(sorted(set(n.__all__) - set(dir(n))), n.load.__module__, n.Module.__module__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["['nbjit.errors']", "False False False", "[] nbjit.module nbjit.module"]
    # loading a cubin or a warm nbjit.compile needs no PTX or fatbin reader, tensor maps or Numba's ABI
    code = """import sys, nbjit; nbjit.compile; nbjit.load
print(sorted(m for m in ("nbjit.ptx", "nbjit.fatbin", "nbjit.tma", "nbjit.numba_abi") if m in sys.modules))"""
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
    import nbjit
    with pytest.raises(AttributeError, match="module 'nbjit' has no attribute 'lod'"):
        getattr(nbjit, "lod")  # noqa: B009 (the module's own attribute look-up is the point)


BUNDLE_ROUTE = {"nbjit", "nbjit.errors", "nbjit._bundle_file", "nbjit._fatbin_write", "nbjit.arch", "nbjit.image",
                "nbjit.cdecl", "nbjit.signature", "nbjit.args", "nbjit._driver", "nbjit.kernel", "nbjit.loader",
                "nbjit.module"}


def test_a_bundles_first_kernel_imports_only_its_route():
    """A package's first kernel from a bundle (issue 26: nbjit's share of a fresh process's
    time to it) imports these modules of nbjit's and no others: no result types of
    nbjit.bundle, no PTX, cubin or fatbin reader, no compiler, cache, tensor maps or Numba ABI;
    nor difflib, shlex or the cp437 codec. It reads no payload but the image's (checked) and
    parses none: the module waiting for first use describes its kernels from the manifest,
    and loading on an sm_90 device takes the manifest's facts of that cubin. A device its
    cubins do not cover runs the PTX, which needs the PTX reader, and only that."""
    import subprocess
    import sys
    bundle = PKG.parent / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit"
    code = f"""
import sys
before = set(sys.modules)
import nbjit
m = nbjit.load_bundle({str(bundle)!r}, lazy=True)
print(m["axpy"].params[1].ctype, m["scale<float>"].params[0].ctype)
from nbjit import args, loader, module
p = loader.plan(m.image, (9, 0), 13000)  # what loading on an sm_90 device hands the driver
# the kernel typed as the loaded module types it, and the first launch's packing plan
info = module._kernel_info(m.name, "axpy", [("cubin", p.info.entry("axpy"))], None, False, m.image.declarations,
                           {{}}, {{}})[0]
args.ArgPacker(info.signature, "axpy").pack((2.0, 4096, 8192, 10))
print(p.kind, p.entry, type(p.info).__name__, info.registers, info.params[2].ctype)
new = set(sys.modules) - before
print(sorted(x for x in new if x.startswith("nbjit") and x != "nbjit._launch"))
print(sorted(x for x in ("difflib", "shlex", "encodings.cp437") if x in new))
loader.plan(m.image, (11, 0), 13000)
print(sorted(x for x in set(sys.modules) - before - new if x.startswith("nbjit")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "const float* float*"
    assert out[1] == "cubin 2 EntryFacts 10 float*"  # (entry 2: the PTX is first in the fatbin, then sm_80, sm_90)
    assert out[2] == str(sorted(BUNDLE_ROUTE)) and out[3] == "[]"
    assert out[4] == "['nbjit.ptx']"
