"""The package's floor plan holds, read from the source (no import needed):

- a folder per stage, each standing only on the stages below it (lazy imports inside
  functions included; imports for type checkers only are not dependencies), and no import
  cycle among modules;
- only ``gpu/`` calls the CUDA driver (``gpu/driver.py``, ``gpu/graphs.py``, ``gpu/timing.py`` and the C launcher) and
  imports Numba (``gpu/host.py``); one module decides whether the C extension is used;
- one way to defer an import (in the function that needs it), no module-level ``__getattr__``
  but the package's own, no ``__module__`` rewrites, no classes made inside functions, no
  file named for when it loads;
- ``import nbjit`` imports its errors only, and a bundle's first kernel needs no compiler,
  cache, PTX reader or Numba ABI."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "nbjit"


def _name(path: Path) -> str:
    """``read.ptx`` for nbjit/read/ptx.py; ``read`` for nbjit/read/__init__.py; ``__init__``."""
    parts = path.relative_to(PKG).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_name(p): p for p in PKG.rglob("*.py")}
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}

# the stages, each standing on those before it (errors, arch, records and files: the ground)
GROUND = {"errors", "arch", "records", "files"}
STAGES = ["params", "read", "gpu", "cache", "toolchain", "launch", "loading", "bundles", "graphs", "tuning",
          "frameworks"]
TOP = {"cli", "__init__", "__main__"}  # (the command line and the public face stand on all)


def stage(module: str) -> str:
    return module.split(".")[0]


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            out.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return out


def imports_of(tree: ast.AST) -> set[str]:
    """nbjit modules a module imports, at module level or inside functions."""
    skip = _type_checking_only(tree)
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "nbjit":
            assert node.level == 0, f"relative import: {ast.unparse(node)}"
            base = node.module[len("nbjit."):] if node.module != "nbjit" else ""
            for a in node.names:
                sub = f"{base}.{a.name}" if base else a.name
                out.add(sub if sub in MODULES else base or a.name)
        elif isinstance(node, ast.Import):
            out.update(a.name[len("nbjit."):] for a in node.names if a.name.startswith("nbjit."))
    return {m for m in out if m in MODULES}


GRAPH = {name: imports_of(tree) - {name} for name, tree in TREES.items()}


def test_the_import_reader_reads_every_form():
    src = ("from nbjit.read.ptx import inspect_ptx\nfrom nbjit.gpu import driver as d\nfrom nbjit import errors\n"
           "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nbjit.loading.module import Module\n"
           "def f():\n    from nbjit.cache.store import Cache\n    import nbjit.params.cdecl\n")
    assert imports_of(ast.parse(src)) == {"read.ptx", "gpu.driver", "errors", "cache.store", "params.cdecl"}


def test_stage_folders_are_plain_and_name_no_public_attribute():
    """Stage folders have an empty ``__init__.py``; none shares a name with a public attribute
    of nbjit (a ``compile/`` folder would shadow ``nbjit.compile``)."""
    import nbjit
    folders = [p for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    assert sorted(p.name for p in folders) == sorted(STAGES + ["cli"] * (PKG / "cli").is_dir())
    for f in folders:
        if f.name in STAGES:
            assert (f / "__init__.py").read_text().strip() == "", f"{f.name}/__init__.py is not empty"
        assert f.name not in nbjit.__all__, f"folder {f.name}/ shadows nbjit.{f.name}"


def test_each_stage_stands_only_on_those_below_it():
    for name, deps in GRAPH.items():
        if name in TOP or stage(name) == "cli":  # (the command line stands on every stage)
            continue
        mine = stage(name)
        allowed = GROUND | set(STAGES[:STAGES.index(mine) + 1]) if mine in STAGES else GROUND
        for d in deps:
            assert stage(d) in allowed, f"{name} imports {d}: {mine}/ stands on {sorted(allowed)}"


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


def test_only_gpu_calls_the_driver():
    """cuda.bindings' driver API (cuLaunchKernel, cuModuleLoadDataEx, ...) is called from
    gpu/driver.py, gpu/graphs.py and gpu/timing.py alone (and the C launcher beside them); Numba's context
    and device objects through gpu/host.py, which asks them."""
    for name, tree in TREES.items():
        if name in ("gpu.driver", "gpu.graphs", "gpu.timing"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("cuda.bindings", "cuda.bindings.driver",
                                                                    "cuda.bindings.runtime"):
                assert node.module == "cuda.bindings" and all(a.name not in ("driver", "runtime")
                                                              for a in node.names), f"{name} imports the driver"
            if isinstance(node, ast.Import):
                assert not any(a.name in ("cuda.bindings.driver", "cuda.bindings.runtime") for a in node.names), name
            if isinstance(node, ast.Attribute) and node.attr.startswith("cu") and node.attr[2:3].isupper():
                raise AssertionError(f"{name}:{node.lineno} calls the driver ({node.attr})")
    c_files = [p.relative_to(PKG).as_posix() for p in PKG.rglob("*.c")]
    assert c_files == ["gpu/_launcher.c"], c_files


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


# Numba core's CPU compiler (@njit), which frameworks/njit.py extends: not a GPU host
_CORE = re.compile(r"numba\.core(\.\w+)*")


def test_only_the_host_imports_numba():
    """Numba's GPU side (numba-cuda or numba-cuda-mlir: its context, arrays, errors, compiler,
    types) is reached through gpu/host.py alone, lazy imports included, so a second host is
    one more implementation in one place. frameworks/njit.py extends Numba core's CPU compiler
    (``numba.core``) and nothing else of Numba."""
    for name, path in MODULES.items():
        found = _numba_imports(path.read_text())
        if name == "frameworks.njit":
            assert found and all(_CORE.fullmatch(m) for _, m in found), found
        elif name != "gpu.host":
            assert not found, f"{name} imports Numba: {found}"
    assert _numba_imports(MODULES["gpu.host"].read_text())  # (where they are)


def test_one_module_decides_whether_the_c_extension_is_used():
    """NBJIT_PURE_PYTHON is read, and the extension imported, in gpu/extension.py alone."""
    for name, tree in TREES.items():
        if name == "gpu.extension":
            continue
        for node in ast.walk(tree):
            assert not (isinstance(node, ast.Constant) and node.value == "NBJIT_PURE_PYTHON"), \
                f"{name}:{node.lineno} reads NBJIT_PURE_PYTHON; ask gpu.extension.extension()"
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nbjit"):
                assert all(a.name != "_launcher" for a in node.names) and "_launcher" not in node.module, \
                    f"{name}:{node.lineno} imports the C extension; ask gpu.extension.extension()"


def test_process_state_is_read_through_functions():
    """Process state (whether CUDA was used, a forked child, the C context getter, several
    GPUs, the chosen host) is read through the functions of the module that keeps it
    (``driver.forked()``, ``driver.multi_gpu()``), never as ``driver._STATE`` from elsewhere."""
    keepers = {"driver", "host", "extension"}
    for name, tree in TREES.items():
        bound = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module == "nbjit.gpu" for a in node.names if a.name in keepers}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                raise AssertionError(f"{name}:{node.lineno} reads {node.value.id}.{node.attr}")


def test_one_way_to_defer_an_import():
    """An import is deferred by writing it in the function that needs it: no module-level
    ``__getattr__`` forwarders (the package's own public face aside), no ``importlib``
    look-ups of nbjit's own modules outside it, no ``__module__`` rewrites, no classes made
    inside functions."""
    for name, tree in TREES.items():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                assert name == "__init__", f"{name} has a module-level __getattr__"
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "__module__"
                                                    for t in node.targets):
                assert name == "records", f"{name}:{node.lineno} rewrites a __module__"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    assert not isinstance(sub, ast.ClassDef), \
                        f"{name}:{sub.lineno}: class {sub.name} made in a function"


def test_files_are_named_for_what_they_hold():
    for name in MODULES:
        assert not re.search(r"_(extra|build|file|write)$", name.split(".")[-1]), f"{name} is named for when it loads"


def _repeated_lazy_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of imports inside functions of a module ``source`` imports at the top
    anyway (the laziness buys nothing there)."""
    tree = ast.parse(source)

    def modules(node) -> list[str]:
        if isinstance(node, ast.ImportFrom):
            if node.module in ("nbjit", "nbjit.gpu", "nbjit.read", "nbjit.params", "nbjit.cache", "nbjit.toolchain",
                               "nbjit.launch", "nbjit.loading", "nbjit.bundles"):  # (a package: its modules)
                return [f"{node.module}.{a.name}" for a in node.names]
            return [node.module or ""]
        return [a.name for a in node.names] if isinstance(node, ast.Import) else []

    top = {m for node in tree.body for m in modules(node)}
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return sorted({(sub.lineno, m) for f in functions for sub in ast.walk(f) for m in modules(sub) if m in top})


def test_no_lazy_import_repeats_a_top_level_one():
    src = ("import os\nfrom nbjit.gpu import driver\nfrom nbjit.errors import A\ndef f():\n"
           "    from nbjit.errors import B\n    from nbjit.gpu import driver, host\n    import os.path\n")
    assert _repeated_lazy_imports(src) == [(5, "nbjit.errors"), (6, "nbjit.gpu.driver")]
    for name, path in MODULES.items():
        assert not _repeated_lazy_imports(path.read_text()), (name, _repeated_lazy_imports(path.read_text()))


def test_the_public_names_are_each_homes_and_every_error():
    """``nbjit.__all__``: each name a module is home to (``_HOMES``), then ``errors.__all__``;
    each home holds its name."""
    import importlib

    import nbjit
    from nbjit import errors
    assert len(nbjit.__all__) == len(set(nbjit.__all__))
    assert nbjit.__all__[-len(errors.__all__):] == errors.__all__
    assert set(nbjit.__all__) == set(nbjit._HOME_OF) | set(errors.__all__)
    from nbjit.gpu.host import current_host
    for name, home in nbjit._HOME_OF.items():
        if home == "gpu.device_functions":  # (device functions are the host's objects, declared to it there)
            if current_host().name == "bare":  # no Numba to declare them to: one clear error says so
                with pytest.raises(nbjit.NbjitHostError, match="compiling or typing a @cuda.jit kernel needs one"):
                    getattr(nbjit, name)
            else:
                assert hasattr(importlib.import_module(f"nbjit.{home}"), name), (name, home)
            continue
        assert hasattr(importlib.import_module(f"nbjit.{home}"), name), (name, home)
        assert getattr(nbjit, name).__module__ in (f"nbjit.{home}", "nbjit.records") or not hasattr(
            getattr(nbjit, name), "__module__"), name
    shown = {n for n in dir(nbjit) if not n.startswith("_")}
    assert set(nbjit.__all__) <= shown, set(nbjit.__all__) - shown


def test_import_nbjit_loads_what_is_used():
    """`import nbjit` imports its errors only; each public name loads its module on first
    use; inspecting or compiling for a given architecture imports no numpy, Numba or driver."""
    code = """
import sys, nbjit
mods = lambda: sorted(m for m in sys.modules if m.startswith("nbjit.") or m in ("numpy", "numba"))
print(mods())
nbjit.inspect_ptx; nbjit.strip_debug; nbjit.inspect_cubin; nbjit.compile_image; nbjit.Cache
print("numpy" in sys.modules, "numba" in sys.modules, "nbjit.gpu.driver" in sys.modules)
nbjit.compile; nbjit.load
print(sorted(m for m in ("nbjit.read.ptx", "nbjit.read.fatbin", "nbjit.launch.tma", "nbjit.params.numba_abi")
             if m in sys.modules))
nbjit.from_numba; nbjit.capture; nbjit.TritonKernel; import nbjit.gpu.host
print(sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "numba_cuda_mlir")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "['nbjit.errors']"
    assert out[1] == "False False False"
    assert out[2] == "['nbjit.read.ptx']"  # (a warm nbjit.compile and a cubin's load read no fatbin, no tma)
    assert out[3] == "[]"  # the stages that serve Numba import it only when they first need it
    import nbjit
    with pytest.raises(AttributeError, match="module 'nbjit' has no attribute 'lod'"):
        getattr(nbjit, "lod")  # noqa: B009 (the module's own attribute look-up is the point)


def test_a_bundles_first_kernel_needs_no_compiler_cache_ptx_reader_or_numba_abi():
    """A package's first kernel from a bundle imports no compiler, cache, PTX reader,
    tensor maps or Numba ABI (nor difflib, shlex or the cp437 codec); it reads no payload
    but the image's (checked) and parses none: the module waiting for first use describes its
    kernels from the manifest, and loading on an sm_90 device takes the manifest's facts of
    that cubin. A device its cubins do not cover runs the PTX, which needs the PTX reader."""
    bundle = PKG.parent / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit"
    code = f"""
import sys
before = set(sys.modules)
import nbjit
m = nbjit.load_bundle({str(bundle)!r}, name="axpy", lazy=True)
print(m["axpy"].params[1].ctype, m["scale<float>"].params[0].ctype)
from nbjit.launch.arguments import ArgPacker
from nbjit.loading.module import _kernel_info
from nbjit.loading.plan import plan
p = plan(m.image, (9, 0), 13000)  # what loading on an sm_90 device hands the driver
# the kernel typed as the loaded module types it, and the first launch's packing plan
info = _kernel_info(m.name, "axpy", [("cubin", p.info.entry("axpy"))], None, False, m.image.declarations, {{}},
                    {{}})[0]
ArgPacker(info.signature, "axpy").pack((2.0, 4096, 8192, 10))
print(p.kind, p.entry, type(p.info).__name__, info.registers, info.params[2].ctype)
new = set(sys.modules) - before
print(sorted(x for x in new if x.startswith("nbjit")))
print(sorted(x for x in ("difflib", "shlex", "encodings.cp437") if x in new))
plan(m.image, (11, 0), 13000)
print(sorted(x for x in set(sys.modules) - before - new if x.startswith("nbjit")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "const float* float*"
    assert out[1] == "cubin 2 EntryFacts 10 float*"  # (entry 2: the PTX is first in the fatbin, then sm_80, sm_90)
    route = set(eval(out[2]))
    assert not {m for m in route if stage(m[len("nbjit."):]) in ("toolchain", "cache")}, route
    assert not route & {"nbjit.read.ptx", "nbjit.read.cubin", "nbjit.launch.tma", "nbjit.params.numba_abi",
                        "nbjit.params.declarations", "nbjit.params.demangle", "nbjit.bundles.build"}, route
    assert out[3] == "[]"
    assert out[4] == "['nbjit.read.ptx']"
