"""Itanium-mangled names read into the demangler's syntax tree (``itanium_demangler``,
with readers whose passes over the tree are linear), and a bound of the text a tree stands
for: what ``cdecl.mangled_tree`` uses for a mangled kernel name. Imported there on the first
mangled name read (an ``extern "C"`` kernel's name needs none of it)."""
from __future__ import annotations

import itanium_demangler as dm  # (a missing one: cdecl.mangled_tree says what to install)

# the library's readers nbjit calls (private: pyproject.toml pins its minor version)
_USED = ("FuncNode", "Node", "_Cursor", "_SPECIAL_RE", "_parse_name", "_parse_type")
if not all(hasattr(dm, n) for n in _USED):
    raise ImportError(f"this itanium_demangler ({getattr(dm, '__file__', '?')}) lacks "
                      + ", ".join(n for n in _USED if not hasattr(dm, n)) + ", which nbjit reads names with")

__all__ = ["parse", "text_size"]

# The work a name's reading may take: parts of the lists the demangler builds, per character
# of the name, past a start. A nested name (``N...E``) builds a list of all its parts so far
# for each part (its prefixes are substitutions), and a substitution of one in another copies
# all of its parts: ``N1a1bS0_S1_S2_...`` doubles its list at each 3 characters (a 101-byte
# name took 5 s, a few more bytes gigabytes), and n parts take n**2/2. Real names stay far
# below: CUB's and Thrust's kernels (nvcc 13.0) and the fixtures' take at most 1.04 per character.
WORK_PER_CHAR = 8
WORK_START = 1 << 14


class _TooMuch(Exception):
    """A name whose reading passed its work (``WORK_PER_CHAR``): not read."""


class _Work:
    """What a name's reading may still spend."""

    def __init__(self, name: str):
        self.left = WORK_START + WORK_PER_CHAR * len(name)

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _TooMuch


def parse(name: str):
    """The demangler's tree of ``name`` (see ``_parse``), or None: also where reading it
    would take more than ``WORK_PER_CHAR`` parts of lists per character (time and memory
    are linear in the name's length)."""
    try:
        return _parse(name)
    except _TooMuch:
        return None


def text_size(tree) -> int:
    """An upper bound of ``len(str(tree))`` for a demangler node (see ``_text_size``)."""
    return _text_size(tree, {})


def _parse(name: str):
    """``itanium_demangler.parse`` with the library's own name and type readers, where its
    passes over the whole tree are linear: the library rewrites the tree as a tree (a
    shared part once per use, so 2**levels times) and looks for each new substitution by
    comparing it with every earlier one. (Names nested in names, ``L_Z...E``, are read by
    the library's own top level.) RTTI, thunks and guard variables are not kernels: None."""
    cursor = LinearCursor(name, 2)
    if dm._SPECIAL_RE.match(name, 2):
        return None
    fname = dm._parse_name(cursor)
    if fname is None or cursor.at_end():
        return None if fname is None else _expand_packs(fname, cursor.work)
    ret_ty = None
    if fname.kind == "qual_name" and fname.value[-1].kind == "tpl_args" and \
            fname.value[-2].kind not in ("ctor", "dtor", "oper_cast"):
        ret_ty = dm._parse_type(cursor)
        if ret_ty is None:
            return None
    arg_tys = []
    while not cursor.at_end():
        arg_ty = dm._parse_type(cursor)
        if arg_ty is None:
            return None
        arg_tys.append(arg_ty)
    func = dm.FuncNode("func", fname, tuple(arg_tys), ret_ty)
    if fname.kind == "qual_name" and fname.value[-1].kind == "tpl_args":  # T_ -> the template's arguments
        tpl_args = fname.value[-1].value

        @_once_per_node
        def expand_params(node):
            if node.kind == "tpl_param" and node.value < len(tpl_args):
                return tpl_args[node.value]
            return node.map(expand_params)
        func = expand_params(func)

    return _expand_packs(func, cursor.work)


def _expand_packs(tree, work: _Work):
    """The library's ``_expand_arg_packs``: template argument packs spliced into the lists
    that hold them (a pack named by each of many ``T_``: its parts counted in ``work``)."""
    @_once_per_node
    def expand(node):
        if node.kind == "tpl_args":
            flat = []
            for arg in node.value:
                part = arg.value if arg.kind in ("tpl_arg_pack", "tpl_args") else (arg,)
                work.spend(len(part))  # (before it is copied)
                flat += part
            return dm.Node("tpl_args", tuple(map(expand, flat)))
        if node.kind == "func":
            node = node.map(expand)
            flat = []
            for a in node.arg_tys:
                if a.kind == "expand_arg_pack" and a.value.kind == "rvalue" and \
                        a.value.value.kind in ("tpl_arg_pack", "tpl_args"):
                    work.spend(len(a.value.value.value))
                    flat += a.value.value.value
                else:
                    flat.append(a)
            return node._replace(arg_tys=tuple(flat))
        return node.map(expand)
    return expand(tree)


def _once_per_node(fn):
    """``fn`` computed once per node object: a tree whose parts are shared is walked in
    time linear in its distinct nodes, not in its size written out."""
    done: dict[int, tuple] = {}

    def once(node):
        hit = done.get(id(node))
        if hit is None:
            hit = done[id(node)] = (node, fn(node))  # (node kept alive: its id is not reused)
        return hit[1]
    return once


# Characters ``str()`` of a demangler node adds to its parts' (``"operator "``, ``"<>"``,
# ``"::*"``); kinds not listed print as ``repr()``.
_STR_EXTRA = {"name": 0, "builtin": 0, "qual_name": 0, "tpl_args": 2, "pointer": 1, "lvalue": 1, "rvalue": 2,
              "cv_qual": 0, "abi": 0, "literal": 2, "tpl_param": 3, "subst": 3, "ctor": 8, "dtor": 8, "oper": 9,
              "oper_cast": 9, "func": 5, "array": 4, "data": 4, "method": 4}


def _text_size(x, sizes: dict, as_repr: bool = False) -> int:
    """An upper bound of ``len(str(x))`` (``len(repr(x))`` with ``as_repr``) for a
    demangler node, each distinct node sized once."""
    if isinstance(x, str):
        return 4 * len(x) + 2 if as_repr else len(x)
    if isinstance(x, int):  # an array's length, a template parameter's number
        return x.bit_length() // 3 + 2
    if isinstance(x, frozenset):  # cv-qualifiers, ABI tags: " const", "[abi:v1]"
        return 13 + sum(4 * len(q) + 4 for q in x) if as_repr else sum(len(q) + 6 for q in x)
    if not isinstance(x, (tuple, list)):
        return 4  # None
    key = (id(x), as_repr)
    hit = sizes.get(key)
    if hit is None:
        if not hasattr(x, "_fields"):  # a sequence of nodes, joined by ", " or "::"
            n = 2 + sum(2 + _text_size(c, sizes, as_repr) for c in x)
        elif as_repr or x.kind not in _STR_EXTRA:
            n = 24 + len(x.kind) + sum(2 + _text_size(c, sizes, True) for c in x[1:])
        else:
            n = _STR_EXTRA[x.kind] + sum(_text_size(c, sizes) for c in x[1:])
        hit = sizes[key] = (x, n)
    return hit[1]


def _structure_key(x, keys: dict[int, tuple], ids: dict) -> object:
    """A value equal for two demangler nodes exactly where the nodes are equal (``==``),
    found once per distinct node."""
    if not isinstance(x, (tuple, list)):
        return ("leaf", x)
    hit = keys.get(id(x))
    if hit is None:
        k = (type(x) is list, tuple(_structure_key(c, keys, ids) for c in x))
        hit = keys[id(x)] = (x, ids.setdefault(k, len(ids)))
    return hit[1]


def _parts(node) -> int:
    """The parts of the lists a demangler node holds (a nested name's, a template's
    arguments, a function's parameters), and one."""
    return 1 + sum(len(f) for f in node[1:] if type(f) is tuple) if isinstance(node, tuple) else 1


class LinearCursor(dm._Cursor):
    """The library's cursor, finding an equal earlier substitution by a dictionary
    rather than by comparing the new one with each (deeply), and counting the work
    (``_Work``): each substitution's lists are built once as it is added (a nested
    name's prefix) and may be copied each time it is named."""

    def __init__(self, raw: str, pos: int = 0):
        super().__init__(raw, pos)
        self._keys: dict[int, tuple] = {}
        self._ids: dict = {}
        self._known: set = set()
        self.work = _Work(raw)

    def add_subst(self, node):
        self.work.spend(_parts(node))
        k = _structure_key(node, self._keys, self._ids)
        if k not in self._known:
            self._known.add(k)
            self._substs[len(self._substs)] = node

    def resolve_subst(self, seq_id):
        node = super().resolve_subst(seq_id)
        self.work.spend(_parts(node))
        return node

