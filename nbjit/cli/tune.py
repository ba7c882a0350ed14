"""``nbjit tune``: the tuning answers in the cache (``nbjit.tune``'s): list them, show one,
clear them. A search itself runs in Python, where its kernels and inputs are."""
from __future__ import annotations

import json

from nbjit.cli.common import Usage, count, table


def run(args) -> int:
    from nbjit.cache.store import default_cache
    actions = [a for a in ("list", "show", "clear") if getattr(args, a) not in (None, False)]
    if len(actions) != 1:
        raise Usage("nbjit tune takes one of --list, --show KEY, --clear [KEY ...]")
    c = default_cache()
    if c.path is None:
        print("no answers: the disk cache is off (NBJIT_CACHE=0)")
        return 0
    if args.json and actions[0] == "clear":
        raise Usage("--json applies to --list and --show, not --clear")
    return {"list": _list, "show": _show, "clear": _clear}[actions[0]](c, args)


def _list(c, args) -> int:
    from nbjit.tuning.answers import listed
    from nbjit.tuning.space import variant_label
    found = listed(c)
    if args.json:
        print(json.dumps([{"cache_key": k, **a.to_json()} for k, a, _ in found], indent=2))
        return 0
    rows = [[k[:16], a.device.get("name", "?"), a.target, json.dumps(a.key), variant_label(a.config), f"{a.ms:.4g}"]
            for k, a, _ in found]
    if not rows:
        print(f"no tuning answers in {c.path}")
        return 0
    for line in table(rows, ["KEY", "GPU", "TARGET", "USER KEY", "ANSWER", "MS"]):
        print(line)
    return 0


def _show(c, args) -> int:
    from nbjit.tuning.answers import named
    from nbjit.tuning.space import variant_label
    key, a = named(c, args.show)
    if args.json:
        print(json.dumps({"cache_key": key, **a.to_json()}, indent=2))
        return 0
    d = a.device
    print(f"key:      {key}")
    print(f"target:   {a.target}")
    print(f"user key: {json.dumps(a.key)}")
    print(f"GPU:      {d.get('name', '?')} ({d.get('arch', '?')}, driver {d.get('driver', '?')})")
    print(f"answer:   {variant_label(a.config)}: {a.ms:.4g} ms a launch")
    n = a.counts
    print(f"searched: {n.get('variants', '?')} variants, {n.get('timed', '?')} timed, {n.get('pruned', '?')} pruned, "
          f"{n.get('failed', '?')} failed, {a.made or 'at an unknown time'}")
    print(f"space:    {json.dumps(a.space)}")
    times = sorted(a.times.items(), key=lambda kv: kv[1])
    for label, ms in times[:10]:
        print(f"  {ms:>10.4g} ms  {label}")
    if len(times) > 10:
        print(f"  (and {len(times) - 10} more)")
    return 0


def _clear(c, args) -> int:
    from nbjit.tuning.answers import named, remove
    keys = [named(c, p)[0] for p in args.clear] or None
    print(f"removed {count(remove(c, keys), 'answer')} from {c.path}")
    return 0


def add_parser(sub) -> None:
    """``nbjit tune``'s arguments, on the command line's subparsers ``sub``."""
    p = sub.add_parser("tune", help="list, show or clear the tuning answers in the cache (nbjit.tune's)",
                       description="The answers of nbjit.tune kept in the cache (docs/tuning.md). The cache is "
                       "$NBJIT_CACHE_DIR or the default; compiled kernels are left as they are.")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--list", action="store_true", help="one line per answer: key, GPU, target, user key, answer, ms")
    g.add_argument("--show", metavar="KEY", help="one answer (its key's first hex digits), with the variants' times")
    g.add_argument("--clear", nargs="*", metavar="KEY", help="remove the answers named (every answer: no KEY)")
    p.add_argument("--json", action="store_true", help="for --list and --show: machine-readable output")
    p.set_defaults(func=run)
