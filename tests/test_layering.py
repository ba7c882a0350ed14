"""The package's layering holds: no import cycle among nbjit's modules (lazy imports inside
functions included); only _driver.py (with the C launch path it sets up) and _driver_extra.py
(the driver's calls off the launch path, standing on _driver) call the CUDA driver, and
_driver stands on the ground floor; only _host.py imports Numba; one module decides
whether the C extension is used; process state is read through functions. Read from the
source, no import needed."""
from __future__ import annotations

import ast
import re
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
            elif node.module == "nbjit":  # from nbjit import x
                out.update(a.name for a in node.names)
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
    """The stages before loading are pure data: none of them imports the driver stage. The
    compiler is told its target (the public entry points ask the device where none is given)."""
    pure = ["arch", "cdecl", "ptx", "cubin", "_elf", "fatbin", "image", "signature", "errors", "cache", "loader",
            "_facts", "pch", "compiler"]
    for m in pure:
        assert not GRAPH[m] & {"_driver", "_driver_extra", "kernel", "module", "triton"}, (m, GRAPH[m])


def test_only_the_driver_module_calls_the_driver():
    """cuda.bindings' driver API (cuLaunchKernel, cuModuleLoadDataEx, ...) is called from
    _driver.py alone, and from _driver_extra.py for what no launch needs (a device's
    attributes, occupancy, tensor maps, graphs); Numba's context and device objects through
    _host, which asks them."""
    for name, path in MODULES.items():
        if name in ("_driver", "_driver_extra"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("cuda.bindings", "cuda.bindings.driver"):
                assert all(a.name != "driver" for a in node.names) or node.module != "cuda.bindings", \
                    f"{name}.py imports cuda.bindings.driver"
                assert node.module != "cuda.bindings.driver", f"{name}.py imports cuda.bindings.driver"
            if isinstance(node, ast.Attribute) and node.attr.startswith("cu") and node.attr[2:3].isupper():
                raise AssertionError(f"{name}.py:{node.lineno} calls the driver ({node.attr})")


def test_the_driver_is_the_ground_floor():
    """_driver imports no stage above it: errors, _native (the C extension's switch) and
    _defs (how records are made), which import nothing of nbjit's; _driver_extra and the host
    stand on _driver."""
    assert GRAPH["_driver"] <= {"errors", "_native", "_defs"}, GRAPH["_driver"]
    assert GRAPH["_native"] == set(), GRAPH["_native"]
    assert GRAPH["_defs"] == set(), GRAPH["_defs"]
    assert GRAPH["_driver_extra"] <= {"_driver", "errors", "_defs"}, GRAPH["_driver_extra"]
    assert GRAPH["_host"] <= {"_driver", "_driver_extra", "_host_extra", "errors", "arch", "_defs"}, GRAPH["_host"]
    assert GRAPH["_host_extra"] <= {"errors"}, GRAPH["_host_extra"]


_NUMBA = re.compile(r"(numba|numba_cuda_mlir)(\.\w+)*")
_DOTTED = re.compile(r"(numba|numba_cuda_mlir)(\.\w+)+")


def _numba_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of Numba (numba-cuda or numba-cuda-mlir) in ``source``:
    import statements at any depth, names handed to ``import_module`` / ``__import__``, and
    dotted module names written out (for ``importlib``, ``sys.modules``)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if _NUMBA.fullmatch(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _NUMBA.fullmatch(node.module):
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in \
                ("import_module", "__import__"):
            out += [(a.lineno, a.value) for a in node.args[:1]
                    if isinstance(a, ast.Constant) and isinstance(a.value, str) and _NUMBA.fullmatch(a.value)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.fullmatch(node.value):
            out.append((node.lineno, node.value))
    return sorted(set(out))


def test_the_numba_import_finder_finds_them():
    src = ("import numbers\nimport numba.cuda as c\ndef f():\n    from numba.core import types\n"
           "    importlib.import_module('numba_cuda_mlir.cuda')\n    __import__('numba')\n"
           "    return sys.modules.get('numba.cuda.cudadrv.driver'), {'numba': 1}, 'numba types'\n")
    assert _numba_imports(src) == [(2, "numba.cuda"), (4, "numba.core"), (5, "numba_cuda_mlir.cuda"), (6, "numba"),
                                   (7, "numba.cuda.cudadrv.driver")]


def test_only_the_host_module_imports_numba():
    """Numba (its context, arrays, errors, compiler, types) is reached through _host alone,
    lazy imports included, so a second host is one more implementation in one place."""
    for name, path in MODULES.items():
        if name != "_host":
            assert not _numba_imports(path.read_text()), f"{name}.py imports Numba: {_numba_imports(path.read_text())}"
    assert _numba_imports(MODULES["_host"].read_text())  # (where they are)


def test_one_module_decides_whether_the_c_extension_is_used():
    """NBJIT_PURE_PYTHON is read, and the extension imported, in _native alone."""
    for name, path in MODULES.items():
        if name == "_native":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            assert not (isinstance(node, ast.Constant) and node.value == "NBJIT_PURE_PYTHON"), \
                f"{name}.py:{node.lineno} reads NBJIT_PURE_PYTHON; ask _native.extension()"
            if isinstance(node, ast.ImportFrom) and (node.level == 1 or node.module == "nbjit"):
                names = [node.module] if node.module and node.level else [a.name for a in node.names]
                assert "_launch" not in names, f"{name}.py:{node.lineno} imports _launch; ask _native.extension()"


def test_process_state_is_read_through_functions():
    """Process state (whether CUDA was used, a forked child, the C context getter, several
    GPUs, the chosen host) is read through the functions of the module that keeps it
    (``_driver.forked()``, ``_driver.multi_gpu()``), never as ``_driver._STATE`` from elsewhere."""
    keepers = {"_driver", "_host", "_native"}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        bound = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module == "nbjit" for a in node.names if a.name in keepers}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                raise AssertionError(f"{name}.py:{node.lineno} reads {node.value.id}.{node.attr}")


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
    # loading a cubin or a warm nbjit.compile needs no PTX or fatbin reader, tensor maps or Numba's ABI;
    # the stages that serve Numba (the host included) import it only when they first need it
    code = """import sys, nbjit; nbjit.compile; nbjit.load
print(sorted(m for m in ("nbjit.ptx", "nbjit.fatbin", "nbjit.tma", "nbjit.numba_abi") if m in sys.modules))
nbjit.from_numba; nbjit.capture; nbjit.TritonKernel; import nbjit._host
numba = sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "numba_cuda_mlir"))
print("nbjit._host" in sys.modules, numba)"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "[]\nTrue []\n"
    import nbjit
    with pytest.raises(AttributeError, match="module 'nbjit' has no attribute 'lod'"):
        getattr(nbjit, "lod")  # noqa: B009 (the module's own attribute look-up is the point)


def _repeated_lazy_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of imports inside functions of a module ``source`` imports at the top
    anyway (the laziness buys nothing there)."""
    tree = ast.parse(source)

    def modules(node) -> list[str]:
        if isinstance(node, ast.ImportFrom):
            if node.module == "nbjit" or not node.module:  # (from nbjit import x: the module nbjit.x)
                return [f"{'.' * node.level or 'nbjit.'}{a.name}" for a in node.names]
            return ["." * node.level + node.module]
        return [a.name for a in node.names] if isinstance(node, ast.Import) else []

    top = {m for node in tree.body for m in modules(node)}
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return sorted({(sub.lineno, m) for f in functions for sub in ast.walk(f) for m in modules(sub) if m in top})


def test_no_lazy_import_repeats_a_top_level_one():
    src = ("import os\nfrom . import _driver\nfrom .errors import A\ndef f():\n    from .errors import B\n"
           "    from . import _driver, tma\n    import os.path\n    from .ptx import C\n")
    assert _repeated_lazy_imports(src) == [(5, ".errors"), (6, "._driver")]
    src = "from nbjit import _driver\ndef f():\n    from nbjit import _driver, tma\n    from nbjit.errors import B\n"
    assert _repeated_lazy_imports(src) == [(3, "nbjit._driver")]
    for name, path in MODULES.items():
        assert not _repeated_lazy_imports(path.read_text()), (name, _repeated_lazy_imports(path.read_text()))


def test_the_public_names_are_each_homes_and_every_error():
    """``nbjit.__all__``: each name a module is home to (``_HOMES``), then ``errors.__all__``."""
    import nbjit
    from nbjit import errors
    assert len(nbjit.__all__) == len(set(nbjit.__all__))
    assert nbjit.__all__[-len(errors.__all__):] == errors.__all__
    assert set(nbjit.__all__) == set(nbjit._HOME_OF) | set(errors.__all__)
    # dir() lists them, not the package's own imports (it showed importlib and TYPE_CHECKING)
    shown = {n for n in dir(nbjit) if not n.startswith("_")}
    import types
    extra = shown - set(nbjit.__all__)
    assert set(nbjit.__all__) <= shown, set(nbjit.__all__) - shown
    assert all(isinstance(getattr(nbjit, n), types.ModuleType) and getattr(nbjit, n).__name__ == f"nbjit.{n}"
               for n in extra), extra  # (nbjit's own submodules, imported)


BUNDLE_ROUTE = {"nbjit", "nbjit.errors", "nbjit._defs", "nbjit._host", "nbjit._native", "nbjit._bundle_file",
                "nbjit._fatbin_write", "nbjit.arch", "nbjit.image", "nbjit.cdecl", "nbjit.signature", "nbjit.args",
                "nbjit._driver", "nbjit.kernel", "nbjit.loader", "nbjit.module"}


def test_a_bundles_first_kernel_imports_only_its_route():
    """A package's first kernel from a bundle (issue 26: nbjit's share of a fresh process's
    time to it) imports these modules of nbjit's and no others: no result types of
    nbjit.bundle, no PTX, cubin or fatbin reader, no compiler, cache, tensor maps or Numba ABI;
    nor difflib, shlex or the cp437 codec. It reads no payload but the image's (checked) and
    parses none: the module waiting for first use describes its kernels from the manifest,
    and loading on an sm_90 device takes the manifest's facts of that cubin. A device its
    cubins do not cover runs the PTX, which needs the PTX reader (with _signature_build,
    which lays out its parameters), and only that."""
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
    assert out[4] == "['nbjit._signature_build', 'nbjit.ptx']"
