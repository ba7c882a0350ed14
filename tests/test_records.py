"""nbjit.records.record makes the classes dataclasses.dataclass makes: each test builds one
class both ways from the same body and holds them to the same behaviour."""
from __future__ import annotations

import copy
import dataclasses
import importlib
import pickle
import pkgutil

import pytest

import nbjit
from nbjit.records import field, record


def twins(body, **options):
    """The class ``body`` (a function returning a fresh class) made by dataclasses and by
    record, with the same options; both named ``T`` so that their reprs compare."""
    dc = dataclasses.dataclass(**{"frozen": True, "eq": True, **options})(body())
    rc = record(**{"frozen": True, "eq": True, **options})(body())
    return dc, rc


def plain():
    class T:
        a: int
        b: str = "x"
        c: tuple = ()
        d: dict = field(default_factory=dict)
        e: object = field(default=None, repr=False, compare=False)
        f: list = field(default_factory=list, repr=False, compare=False)
    return T


def seen(obj):
    """What a user sees of an instance: its type's name, vars in order, repr."""
    return type(obj).__qualname__, list(vars(obj).items()), repr(obj)


def outcome(cls, *args, **kwargs):
    try:
        return "ok", seen(cls(*args, **kwargs))
    except TypeError as e:
        return "TypeError", str(e).replace(f"{cls.__qualname__}.", "")


CALLS = [((1,), {}), ((1, "y"), {}), ((1, "y", (2,), {"k": 1}, 5, [1]), {}), ((), {"a": 1}),
         ((), {"b": "z", "a": 1}), ((1,), {"d": {"q": 2}, "c": (3,)}), ((), {}), ((1, 2, 3, 4, 5, 6, 7), {}),
         ((1,), {"a": 2}), ((1,), {"zz": 2}), ((), {"b": "z"})]


@pytest.mark.parametrize("options", [{}, {"frozen": False}, {"eq": False}, {"frozen": False, "eq": False}])
@pytest.mark.parametrize("args,kwargs", CALLS)
def test_construction_and_its_errors_are_the_dataclasses(options, args, kwargs):
    dc, rc = twins(plain, **options)
    assert outcome(rc, *args, **kwargs) == outcome(dc, *args, **kwargs)


@pytest.mark.parametrize("options", [{}, {"frozen": False}, {"eq": False}, {"frozen": False, "eq": False}])
def test_equality_hashing_and_freezing_are_the_dataclasses(options):
    dc, rc = twins(plain, **options)
    for cls in (dc, rc):
        cls.pair = (cls(1, e=1, f=[1]), cls(1, e=2, f=[2]), cls(2))
    for x, y in [(0, 1), (0, 2), (1, 2)]:
        assert (dc.pair[x] == dc.pair[y]) == (rc.pair[x] == rc.pair[y])
    assert (rc(1) == dc(1)) is False and (rc(1) == 1) is False
    assert (dc.__hash__ is None) == (rc.__hash__ is None)
    if dc.__hash__ is not None:
        def hashes(cls, **d):
            try:
                return hash(cls(1, **d)) == hash(cls(1, e=5, f=[5], **d))
            except TypeError as e:
                return str(e)
        assert hashes(rc) == hashes(dc) and hashes(rc, d=()) == hashes(dc, d=())
    if options.get("frozen", True):
        for cls in (dc, rc):
            with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'a'"):
                cls(1).a = 2
            with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'b'"):
                del cls(1).b
            with pytest.raises(dataclasses.FrozenInstanceError):
                cls(1).other = 2
    else:
        r = rc(1)
        r.a = 5
        assert r.a == 5 and (r == rc(5)) == options.get("eq", True)


def test_the_dataclasses_functions_work_on_records():
    dc, rc = twins(plain)
    assert dataclasses.is_dataclass(rc) and dataclasses.is_dataclass(rc(1))
    assert [(f.name, f.default, f.default_factory, f.repr, f.compare) for f in dataclasses.fields(rc)] == \
        [(f.name, f.default, f.default_factory, f.repr, f.compare) for f in dataclasses.fields(dc)]
    assert dataclasses.asdict(rc(1, "y", (2,))) == dataclasses.asdict(dc(1, "y", (2,)))
    assert dataclasses.astuple(rc(1)) == dataclasses.astuple(dc(1))
    assert seen(dataclasses.replace(rc(1, "y"), a=3)) == seen(dataclasses.replace(dc(1, "y"), a=3))
    with pytest.raises(TypeError):
        dataclasses.replace(rc(1), zz=1)
    assert rc.__match_args__ == dc.__match_args__ == ("a", "b", "c", "d", "e", "f")
    match rc(7, "q"):
        case rc(a, b):
            assert (a, b) == (7, "q")
    assert rc.b == dc.b == "x" and not hasattr(rc, "d") and not hasattr(dc, "d")
    assert rc.__init__.__qualname__ == "plain.<locals>.T.__init__"


def test_pickles_and_copies_as_dataclasses_do():
    from nbjit.arch import Arch
    r = Arch.parse("sm_90a")  # (module-level records: picklable)
    from nbjit.params.signature import Directives
    d = Directives(maxntid=(128, 1, 1))
    for obj in (r, d):
        assert pickle.loads(pickle.dumps(obj)) == obj
        assert copy.copy(obj) == obj and copy.deepcopy(obj) == obj
    _, rc = twins(plain)
    c = copy.copy(rc(1, d={"k": 1}))
    assert c.d == {"k": 1}


def test_post_init_and_explicit_methods_are_kept():
    def body():
        class T:
            a: int
            b: int = 0

            def __post_init__(self):
                if self.a < 0:
                    raise ValueError("negative")
                object.__setattr__(self, "total", self.a + self.b)

            def __eq__(self, other):
                return isinstance(other, T) and self.total == other.total

            def __hash__(self):
                return hash(self.total)

            def __repr__(self):
                return f"T<{self.total}>"
        return T
    dc, rc = twins(body)
    for cls in (dc, rc):
        assert cls(1, 2) == cls(3) and hash(cls(1, 2)) == hash(cls(3)) and repr(cls(1, 2)) == "T<3>"
        with pytest.raises(ValueError, match="negative"):
            cls(-1)
    assert seen(rc(1, 2)) == seen(dc(1, 2))


def test_what_dataclasses_refuse_record_refuses_and_what_it_does_not_offer_too():
    def mutable():
        class T:
            a: list = []
        return T

    def order():
        class T:
            a: int = 0
            b: int
        return T

    def kw_only():
        class T:
            a: int = field(default=0, kw_only=True)
        return T
    for body, error in ((mutable, ValueError), (order, TypeError)):
        with pytest.raises(error):
            dataclasses.dataclass(body())
        with pytest.raises(error):
            record(body())
    with pytest.raises(TypeError, match="kw_only"):
        record(kw_only())


def test_a_record_that_holds_itself_shows_as_dataclasses_show_it():
    dc, rc = twins(plain, frozen=False)
    a, b = dc([]), rc([])
    a.a.append(a)
    b.a.append(b)
    assert repr(a) == repr(b) == "plain.<locals>.T(a=[...], b='x', c=(), d={})"


def test_nbjits_classes_are_records():
    """Every dataclass nbjit defines is made by record (importing them stays cheap),
    and behaves as the dataclass of the same body would (checked on each one's defaults)."""
    seen_any = 0
    for info in pkgutil.walk_packages(nbjit.__path__, "nbjit."):
        if info.name in ("nbjit.__main__",):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # (an optional extra's module; the others are enough)
            continue
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == info.name and dataclasses.is_dataclass(value):
                assert value.__init__.__code__.co_filename.endswith("records.py"), value
                seen_any += 1
    assert seen_any >= 30


def test_each_instance_gets_its_own_default_made_by_a_factory():
    """The defaults a factory makes are made afresh for each instance, however it is called
    (positionally with fewer arguments than fields: the usual call, or with keywords)."""
    dc, rc = twins(plain)
    for args, kwargs in (((1,), {}), ((1, "y", ()), {}), ((), {"a": 1})):
        one, two = rc(*args, **kwargs), rc(*args, **kwargs)
        assert one.d == {} and one.d is not two.d and one.f is not two.f
        assert seen(one) == seen(dc(*args, **kwargs))
