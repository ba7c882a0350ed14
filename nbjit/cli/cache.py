"""``nbjit cache``: the compile cache's information, entries, pruning and clearing, archives
(export, import) and remote tier (push, pull)."""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time

from nbjit.cli.common import Usage, binary_to_stdout, count, read_input, shown, size_arg
from nbjit.errors import NbjitError


def run(args) -> int:
    from nbjit.cache.store import Cache, default_cache

    _check_options(args)
    if args.action == "export" and args.file == "-":
        binary_to_stdout("a cache archive", "cache export -")
    c = default_cache()
    if args.remote is not None:
        c = Cache(c.path, max_bytes=c.max_bytes, lock_timeout=c.lock_timeout, remote=args.remote)
    if args.action in ("push", "pull") and c.remote is None:
        raise Usage(f"'cache {args.action}' needs a remote cache: give --remote URL (s3://bucket/prefix, "
                    "gs://..., file:///dir) or set NBJIT_CACHE_REMOTE")
    if args.action in ("clear", "prune") and c.path is None:
        print(f"nothing to {args.action}: the disk cache is off (NBJIT_CACHE=0)")
        return 0
    return _ACTIONS[args.action](c, args)


def _check_options(args) -> None:
    """Refuse the options the action does not take, in one line each."""
    if args.max_bytes is not None and args.action != "prune":
        raise Usage(f"--max-bytes applies to 'cache prune', not 'cache {args.action}'")
    if args.key_file is not None and args.action not in ("export", "import"):
        raise Usage(f"--key-file applies to 'cache export' and 'cache import', not 'cache {args.action}'")
    if (args.file is None) == (args.action in ("export", "import")):
        raise Usage(f"'cache {args.action}' takes an archive FILE" if args.file is None
                    else f"'cache {args.action}' takes no FILE (only export and import do)")
    if args.json and args.action not in ("info", "list"):
        raise Usage(f"--json applies to 'cache info' and 'cache list', not 'cache {args.action}'")
    if args.remote is not None and args.action not in ("info", "list", "push", "pull"):
        raise Usage(f"--remote applies to 'cache info', 'list', 'push' and 'pull', not 'cache {args.action}' "
                    "(which works on the local cache only)")


def _info(c, args) -> int:
    from nbjit.cache.store import format_size
    i = c.info()
    if c.remote is not None:
        try:
            listed = c.remote.listing()
            i.update(remote_entries=len(listed), remote_bytes=sum(n for _, n in listed))
        except NbjitError as e:  # info says what it can: the store's trouble is part of it
            i.update(remote_entries=None, remote_error=str(e))
    if args.json:
        print(json.dumps(i, indent=2, default=str))
        return 0
    print(f"location: {os.path.abspath(i['location']) if i['location'] else '(disk cache off: NBJIT_CACHE=0)'}")
    print(f"entries:  {i['entries']}" + (f" (and {i['temporary_files']} temporary files of writers)"
                                         if i["temporary_files"] else ""))
    print(f"size:     {format_size(i['bytes'])} (limit {format_size(i['max_bytes'])})")
    if c.remote is None:
        print("remote:   none (NBJIT_CACHE_REMOTE or --remote)")
    else:
        mode = "read-write" if i["remote_write"] else "read-only"
        print(f"remote:   {i['remote']} ({mode}): " + (f"{count(i['remote_entries'], 'entry')}, "
                                                      f"{format_size(i['remote_bytes'])}"
                                                      if i["remote_entries"] is not None else i["remote_error"]))
    return 0


def _list(c, args) -> int:
    from nbjit.cache.entries import OTHER_FORMAT, entry_file
    rows = []
    for f, size, used in c.entries():
        got = entry_file(f)
        if got is None:
            continue  # removed meanwhile by another process
        entry, why, _ = got
        status = "ok" if entry else "unused" if why.startswith(OTHER_FORMAT) else "corrupt"
        if args.json:
            rows.append({"key": f.stem, "bytes": size, "used": used, "where": "local", "status": status,
                         "why": why or None,
                         **({"kind": entry.kind, "arch": entry.arch, "producer": entry.producer} if entry else {})})
            continue
        what = f"{entry.kind} {entry.arch} {entry.producer}" if entry else f"{status}: {why}"
        print(f"{f.stem[:16]}  {size:>9}  {time.strftime('%Y-%m-%d %H:%M', time.localtime(used))}  {what}")
    if c.remote is not None:
        local = {r["key"] for r in rows} if args.json else {f.stem for f, _, _ in c.entries()}
        for key, size in c.remote.listing():
            # the remote's objects are listed, not fetched: each is checked when it is used or pulled
            where = "remote and local" if key in local else "remote only"
            if args.json:
                rows.append({"key": key, "bytes": size, "where": "remote", "local": key in local})
            else:
                print(f"{key[:16]}  {size:>9}  {'':16}  {where}: {c.remote.url}")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


def _push(c, args) -> int:
    pushed, there = c.push()
    print(f"published {count(pushed, 'entry')} to {c.remote.url}" + _there(there))
    return 0


def _pull(c, args) -> int:
    added, refused = c.pull()
    for why in refused:
        print(f"refused {why}", file=sys.stderr)
    print(f"pulled {count(added, 'new entry')} from {c.remote.url} into {c.path}"
          + (f"; refused {len(refused)}" if refused else ""))
    return 1 if refused else 0


def _clear(c, args) -> int:
    print(f"removed {count(c.clear(), 'entry')} from {c.path}")
    return 0


def _prune(c, args) -> int:
    from nbjit.cache.store import format_size
    print(f"removed {count(c.prune(args.max_bytes), 'entry')}; {format_size(c.info()['bytes'])} left "
          f"(limit {format_size(c.max_bytes if args.max_bytes is None else args.max_bytes)})")
    return 0


def _export(c, args) -> int:
    if args.file == "-":  # streamed to standard output, as tar does; what was done said on standard error
        n = c.export_archive(sys.stdout.buffer, archive_key_file=args.key_file)
        sys.stdout.buffer.flush()
        print(f"exported {count(n, 'entry')} to {shown('-')}", file=sys.stderr)
    else:
        print(f"exported {count(c.export_archive(args.file, archive_key_file=args.key_file), 'entry')} to "
              f"{args.file}")
    return 0


def _import(c, args) -> int:
    src = args.file
    if src == "-":
        src = io.BytesIO(read_input("-"))
        src.name = "<stdin>"
    got = c.import_archive(src, archive_key_file=args.key_file)
    added, refused = got
    for why in refused:
        print(f"refused {why}", file=sys.stderr)
    print(f"imported {count(added, 'new entry')} into {c.path}" + _there(got.present)
          + (f"; refused {len(refused)}" if refused else ""))
    return 1 if refused else 0


_ACTIONS = {"info": _info, "list": _list, "clear": _clear, "prune": _prune, "export": _export, "import": _import,
            "push": _push, "pull": _pull}


def _there(n: int) -> str:
    """What a report adds for ``n`` entries that were there already."""
    return "" if not n else "; 1 was there already" if n == 1 else f"; {n} were there already"


# nbjit cache's actions, as its --help says them
_CACHE_ACTIONS = {
    "info": "location, entries and size (and the remote tier's, with --remote)",
    "list": "one line per entry: key, bytes, last use, kind, architecture, producer",
    "clear": "remove every entry",
    "prune": "remove the least recently used entries down to the limit (--max-bytes)",
    "export": "write the verified entries to an archive FILE (.tar.gz; - for stdout)",
    "import": "add an archive FILE's entries, each verified (- for stdin)",
    "push": "publish the verified local entries to the remote tier (--remote)",
    "pull": "copy the remote tier's entries this cache lacks, each verified",
}


def add_parser(sub) -> None:
    """``nbjit cache``'s arguments, on the command line's subparsers ``sub``."""
    p = sub.add_parser("cache", help="show, list, clear, prune, export or import nbjit's compile cache; push "
                       "to or pull from its remote tier", formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="nbjit's compile cache (docs/cache.md).\n\nactions:\n" + "\n".join(
                           f"  {a:<8}{what}" for a, what in _CACHE_ACTIONS.items()))
    p.add_argument("action", choices=list(_CACHE_ACTIONS), metavar="ACTION", help="one of the actions above")
    p.add_argument("file", nargs="?", help="for export and import: the archive (a .tar.gz; - for standard output "
                   "or input)")
    p.add_argument("--max-bytes", type=size_arg, metavar="SIZE", help="for prune: the size to prune to, in bytes "
                   "or with a unit: 100k, 512M, 1G (powers of 1024; default: the cache's limit)")
    p.add_argument("--json", action="store_true", help="for info and list: machine-readable output")
    p.add_argument("--key-file", help="for export and import: sign with, or import only archives signed with, "
                   "the archive key in this file (default: $NBJIT_CACHE_ARCHIVE_KEY_FILE, $NBJIT_CACHE_ARCHIVE_KEY)")
    p.add_argument("--remote", metavar="URL", help="the remote tier (s3://bucket/prefix, gs://..., file:///dir or "
                   "an existing directory, https://... read-only; default: $NBJIT_CACHE_REMOTE); push and pull need "
                   "one")
    p.set_defaults(func=run)
