"""A shared tier behind the local cache: the same entry files in an object store (S3, GCS,
Azure, a directory, HTTP read-only), reached through fsspec.

Entries are immutable and named by their key, so no lock across machines is needed: two
nodes that compile the same source publish the same bytes, the first publish wins and later
ones are skipped (looked for first; on S3 a conditional put). The store is never trusted
with a byte: the cache checks every object it fetches as it checks its own files. The store
is never waited on for long either: every call has a deadline, and after repeated failures
the tier is left alone for a while (one warning), so that compiles go on locally.
"""
from __future__ import annotations

import importlib.util
import os
import re
import secrets
import threading
import time
from urllib.parse import unquote, urlsplit, urlunsplit

from nbjit.errors import NbjitCacheError, install_hint, warn

__all__ = ["RemoteTier", "REMOTE_ENV", "REMOTE_WRITE_ENV"]

REMOTE_ENV = "NBJIT_CACHE_REMOTE"
REMOTE_WRITE_ENV = "NBJIT_CACHE_REMOTE_WRITE"
_SUFFIX = ".nbjit"
_ENTRY = re.compile(r"(?:^|/)([0-9a-f]{2})/([0-9a-f]{64})\.nbjit$")
_READ_ONLY = ("http", "https")  # fsspec's HTTP filesystem cannot write
# a single PUT is all or nothing on these; elsewhere a publish writes a temporary key and renames it
_CONDITIONAL_PUT = ("s3", "s3a")
_OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "http", "https")
_SECRET_OPTION = re.compile(r"secret|token|password|passwd|credential|key|sas|signature", re.I)
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN",
               "AZURE_STORAGE_CONNECTION_STRING", "AZURE_CLIENT_SECRET")


class _Unavailable(Exception):
    """The store did not answer as it should (the message says why, credentials scrubbed)."""


class RemoteTier:
    """An object-store tier at ``url`` (``s3://bucket/prefix``, ``gs://...``, ``az://...``,
    ``file:///dir``, ``https://host/dir`` read-only), behind a local ``Cache``.

    ``write``: publish entries compiled here (default: yes, unless the store is HTTP).
    ``timeout``: seconds any one call to the store may take. ``failures`` calls failing in a
    row leave the store alone for ``cooldown`` seconds (one ``NbjitWarning``).
    ``options``: fsspec storage options (``endpoint_url``, ``profile``, ...); credentials
    come from the store's usual places (for S3: the environment, ``~/.aws``, an instance role).
    Raises ``NbjitCacheError`` for a URL fsspec has no filesystem for, or whose package
    (s3fs, gcsfs, adlfs) is not installed, and for a local one (``file://``, a path) that is
    no existing directory.
    """

    def __init__(self, url: str, *, write: bool | None = None, timeout: float = 10.0, failures: int = 3,
                 cooldown: float = 60.0, options: dict | None = None):
        if not isinstance(url, str) or not url.strip():
            raise NbjitCacheError(f"a remote cache is a URL (s3://bucket/prefix, gs://..., file:///dir), not {url!r}")
        if type(timeout) is bool or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise NbjitCacheError(f"a remote cache's timeout must be seconds > 0, not {timeout!r}")
        if type(failures) is bool or not isinstance(failures, int) or failures < 1:
            raise NbjitCacheError(f"a remote cache's failures must be a count >= 1, not {failures!r}")
        if type(cooldown) is bool or not isinstance(cooldown, (int, float)) or not cooldown >= 0:
            raise NbjitCacheError(f"a remote cache's cooldown must be seconds >= 0, not {cooldown!r}")
        if options is not None and not isinstance(options, dict):
            raise NbjitCacheError(f"a remote cache's options are a dict of fsspec storage options, not "
                                  f"{type(options).__name__}")
        self._url = url.strip().rstrip("/")
        self._secrets = _secrets_of(self._url, options or {})
        self.url = self._scrub(_shown_url(self._url))  # what messages show: no user, password or query
        self.protocol = _protocol(self._url)
        _check_installed(self.protocol, self.url)
        if self.protocol == "file":
            _check_directory(self._url, self.url)
        if write is None:
            write = self.protocol not in _READ_ONLY
        elif not isinstance(write, bool):
            raise NbjitCacheError(f"remote_write is True or False (None: where the store is writable), not {write!r}")
        elif write and self.protocol in _READ_ONLY:
            raise NbjitCacheError(f"the remote cache {self.url} is read-only ({self.protocol}): use remote_write=False")
        self.write = write
        self.timeout = float(timeout)
        self.failures = failures
        self.cooldown = float(cooldown)
        self._options = dict(options or {})
        self._fs = None
        self._root = ""
        self._lock = threading.Lock()
        self._failed = 0  # calls failed in a row
        self._closed_until = 0.0  # monotonic time before which the store is left alone
        self._warned = False  # a warning since the last call that succeeded
        self._corrupt: set[str] = set()  # keys whose remote object failed its checks here

    def __repr__(self) -> str:
        return f"<nbjit.RemoteTier {self.url} ({'read-write' if self.write else 'read-only'})>"

    def __reduce__(self):
        raise TypeError("a RemoteTier holds credentials and a connection: make one in each process")

    # ---------------------------------------------------------------- what the cache asks
    def get(self, key: str, max_bytes: int) -> bytes | None:
        """The object for ``key``, or None: not there, larger than ``max_bytes`` (never read
        whole), or the store not answering (counted toward leaving it alone)."""
        try:
            return self._get(key, max_bytes)
        except _Unavailable:
            return None

    def put(self, key: str, data: bytes) -> bool:
        """Publish ``data`` as the object for ``key`` unless one is there already (or the
        store is read-only or not answering); True where this call wrote it. A key whose
        object failed its checks here (``corrupt``) is overwritten."""
        if not self.write:
            return False
        try:
            return self._put(key, data, overwrite=key in self._corrupt)
        except _Unavailable:
            return False
        except PermissionError as e:
            self.write = False
            warn(f"nbjit cache: the remote cache {self.url} refuses writes ({self._scrub(_why(e))}); reading it "
                  f"only from now on (remote_write=False for read-only consumers)")
            return False

    def corrupt(self, key: str, why: str) -> None:
        """The object for ``key`` failed its checks: warn once, and let the next publish replace it."""
        if key not in self._corrupt:
            self._corrupt.add(key)
            warn(f"nbjit cache: the remote object {self.url}/{key[:2]}/{key}{_SUFFIX} is corrupt ({why}); "
                  f"not used: compiling here" + (" and publishing it again" if self.write else ""))

    def published(self, key: str) -> None:
        """The object for ``key`` is good again."""
        self._corrupt.discard(key)

    # ---------------------------------------------------------------- management (strict)
    def listing(self) -> list[tuple[str, int]]:
        """(key, bytes) of every entry object in the store; ``NbjitCacheError`` if it cannot be listed."""
        if self.protocol in _READ_ONLY:
            raise NbjitCacheError(f"the remote cache {self.url} is served over {self.protocol}, which cannot be "
                                  f"listed: its entries are fetched one by one as compiles miss")
        try:
            found = self._call(lambda fs: fs.find(self._root, detail=True), "list", wait=max(self.timeout, 60.0))
            # (an object store's empty prefix is no error; a file:// cache's missing directory is: a typo)
            missing = not found and self.protocol == "file" and not self._call(lambda fs: fs.isdir(self._root),
                                                                                "list")
        except FileNotFoundError:
            missing = self.protocol == "file"
            found = {}
        except _Unavailable as e:
            raise NbjitCacheError(f"cannot list the remote cache {self.url}: {e}") from None
        if missing:
            raise _no_directory(self.url)
        out = []
        for name, info in sorted(found.items()):
            m = _ENTRY.search(name)
            if m and m[2][:2] == m[1]:
                out.append((m[2], int(info.get("size") or 0)))
        return out

    def fetch(self, key: str, max_bytes: int) -> bytes | None:
        """``get`` that raises ``NbjitCacheError`` where the store does not answer."""
        try:
            return self._get(key, max_bytes)
        except _Unavailable as e:
            raise NbjitCacheError(f"cannot read {self.url}/{key[:2]}/{key}{_SUFFIX}: {e}") from None

    def publish(self, key: str, data: bytes, *, overwrite: bool = False) -> bool:
        """``put`` that raises ``NbjitCacheError`` where the store refuses or does not answer."""
        if not self.write:
            raise NbjitCacheError(f"the remote cache {self.url} is read-only here (remote_write=False)")
        try:
            return self._put(key, data, overwrite=overwrite or key in self._corrupt)
        except (_Unavailable, PermissionError) as e:  # (an _Unavailable's text is the store's error, scrubbed)
            why = str(e) if isinstance(e, _Unavailable) else self._scrub(_why(e))
            raise NbjitCacheError(f"cannot publish to {self.url}/{key[:2]}/{key}{_SUFFIX}: {why}") from None

    # ---------------------------------------------------------------- the store
    def _path(self, key: str) -> str:
        """Where the object for ``key`` is (once ``_filesystem`` has found the root)."""
        return f"{self._root}/{key[:2]}/{key}{_SUFFIX}"

    def _get(self, key: str, max_bytes: int) -> bytes | None:
        def read(fs):
            path = self._path(key)
            # its size first (a miss is this one request): an object larger than an entry can be
            # is not one, and none of it is read
            size = fs.info(path).get("size")
            if type(size) is int and size > max_bytes:
                return None
            # (a store that gave no size: one byte more than an entry can be, never more)
            return fs.cat_file(path, start=0, end=max_bytes + 1)
        try:
            data = self._call(read, "read")
        except FileNotFoundError:
            return None
        if data is None or len(data) > max_bytes:
            return None
        return data if type(data) is bytes else bytes(data)  # (the store's bytes as they came: no copy)

    def _put(self, key: str, data: bytes, overwrite: bool) -> bool:
        if not overwrite and self._call(lambda fs: fs.exists(self._path(key)), "look up"):
            return False  # the first publisher won: identical bytes are there
        if self.protocol in _CONDITIONAL_PUT:
            try:
                # one PUT is all or nothing; If-None-Match makes the first of two racing publishers win
                self._call(lambda fs: fs.pipe_file(self._path(key), data, mode="overwrite" if overwrite else "create"),
                           "write")
            except FileExistsError:
                return False
        else:
            def write(fs):
                path = self._path(key)
                tmp = f"{self._root}/{key[:2]}/.tmp-{os.getpid()}-{secrets.token_hex(6)}"
                if self.protocol not in _OBJECT_STORES:
                    fs.makedirs(f"{self._root}/{key[:2]}", exist_ok=True)
                fs.pipe_file(tmp, data)
                try:
                    fs.mv(tmp, path)  # readers see the whole object or none
                except BaseException:
                    try:
                        fs.rm(tmp)
                    except Exception:  # noqa: BLE001  # the store is failing already: the rename's error says why
                        pass
                    raise
            self._call(write, "write")
        self.published(key)
        return True

    def _filesystem(self):
        if self._fs is None:
            import fsspec.core
            opts = dict(self._options)
            if self.protocol in _CONDITIONAL_PUT and "config_kwargs" not in opts:
                # botocore's own deadlines, so that a call abandoned at our deadline ends soon after
                opts["config_kwargs"] = {"connect_timeout": self.timeout, "read_timeout": self.timeout,
                                         "retries": {"max_attempts": 2}}
            fs, root = fsspec.core.url_to_fs(self._url, **opts)
            self._root = root.rstrip("/")  # before _fs: another thread that sees _fs uses it
            self._fs = fs
        return self._fs

    def _call(self, fn, what: str, wait: float | None = None):
        """``fn(filesystem)`` within the deadline; FileNotFoundError and FileExistsError pass
        through (answers, not failures), and PermissionError of a write; any other failure is
        ``_Unavailable``, counted."""
        answers = (FileNotFoundError, FileExistsError, PermissionError) if what == "write" else \
            (FileNotFoundError, FileExistsError)
        with self._lock:
            if time.monotonic() < self._closed_until:
                raise _Unavailable(f"left alone after {self.failures} failures in a row")
        try:
            result = _within(lambda: fn(self._filesystem()), wait or self.timeout)
        except answers:
            self._succeeded()
            raise
        except ImportError as e:
            raise NbjitCacheError(f"the remote cache {self.url} needs {e.name or 'a package'}: install "
                                  f"{install_hint('remote')}, or the fsspec package for {self.protocol}://") from None
        except Exception as e:  # noqa: BLE001  # whatever a store's client raises: the store did not answer
            why = self._scrub(_why(e))
            self._failed_call(what, why)
            raise _Unavailable(why) from None
        self._succeeded()
        return result

    def _succeeded(self) -> None:
        with self._lock:
            self._failed, self._warned = 0, False

    def _failed_call(self, what: str, why: str) -> None:
        with self._lock:
            self._failed += 1
            if self._failed < self.failures:
                return
            self._failed = 0
            self._closed_until = time.monotonic() + self.cooldown
            if self._warned:
                return
            self._warned = True
        warn(f"nbjit cache: the remote cache {self.url} failed {self.failures} times in a row (last: {what}: "
              f"{why}); using the local cache only for {self.cooldown:g} s")

    def _scrub(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text


def _within(fn, timeout: float):
    """``fn()``, or TimeoutError after ``timeout`` seconds (the call is abandoned, in a daemon
    thread: a store's client may not stop when asked)."""
    box: dict = {}
    done = threading.Event()

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001  # handed to the caller
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="nbjit-remote-cache", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"no answer in {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text if len(text) <= 300 else text[:300] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def _shown_url(url: str) -> str:
    """``url`` without a user name, password, query or fragment (presigned tokens, SAS keys)."""
    if "://" not in url:
        return url
    try:
        p = urlsplit(url)
        host = p.hostname or ""
        if p.port:
            host = f"{host}:{p.port}"
        return urlunsplit((p.scheme, host, p.path, "", ""))
    except ValueError:
        return url.split("://", 1)[0] + "://(a URL nbjit cannot read)"


def _secrets_of(url: str, options: dict) -> list[str]:
    """Strings a message must never show: the URL's password and query, option values named
    like secrets, and the usual credential variables of the environment."""
    found = []
    try:
        p = urlsplit(url)
        found += [p.password or "", p.username or "", p.query, p.fragment]
    except ValueError:
        pass

    def walk(d):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v)
            elif isinstance(v, str) and _SECRET_OPTION.search(str(k)):
                found.append(v)
    walk(options)
    found += [os.environ.get(v, "") for v in _SECRET_ENV]
    return sorted({s for s in found if len(s) >= 4}, key=len, reverse=True)


def _check_installed(protocol: str, url: str) -> None:
    """Refuse a URL fsspec cannot serve here, before any compile relies on it (the backend's
    package is looked for, not imported: s3fs alone imports in a third of a second)."""
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        raise NbjitCacheError(f"the remote cache {url} needs fsspec: install {install_hint('remote')}") from None
    if protocol in registry:
        return
    impl = known_implementations.get(protocol)
    if impl is None:
        raise NbjitCacheError(f"the remote cache {url}: fsspec knows no filesystem for {protocol}:// (s3://, gs://, "
                              f"az://, file://, https:// are the usual ones)")
    module = impl["class"].rsplit(".", 1)[0]
    try:
        found = importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise NbjitCacheError(f"the remote cache {url} needs the {module.split('.')[0]} package "
                              f"({impl.get('err', 'not installed')}): for S3, install {install_hint('remote')}")


def _check_directory(url: str, shown: str) -> None:
    """Refuse a local remote cache (``file://`` or a path) that is no existing directory: a
    mistyped URL (``s3:/bucket``, one slash) is a path, and a publish would make it one."""
    if "://" in url:
        path = unquote(urlsplit(url).path)
        if os.path.isdir(path):
            return
        raise _no_directory(shown)
    if os.path.isdir(url):
        return
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):/*(.+)", url)
    near = ""
    if m and m[1].lower() != "file":
        from fsspec.registry import known_implementations, registry
        if m[1].lower() in registry or m[1].lower() in known_implementations:
            near = f": did you mean {m[1]}://{m[2]}?"
    raise NbjitCacheError(f"the remote cache {shown!r} is neither a URL (s3://bucket/prefix, gs://..., file:///dir) "
                          f"nor an existing directory{near}")


def _no_directory(shown: str) -> NbjitCacheError:
    return NbjitCacheError(f"the remote cache {shown}: no such directory (a file:// remote cache is a directory: "
                           "check the URL, or create it)")


def tier_from_env() -> RemoteTier | None:
    """The tier ``NBJIT_CACHE_REMOTE`` names (``NBJIT_CACHE_REMOTE_WRITE=0``: read only), or None."""
    url = os.environ.get(REMOTE_ENV, "").strip()
    if not url:
        return None
    raw = os.environ.get(REMOTE_WRITE_ENV, "").strip().lower()
    if raw in ("", "auto"):
        write = None
    elif raw in ("1", "true", "yes", "on"):
        write = True
    elif raw in ("0", "false", "no", "off"):
        write = False
    else:
        raise NbjitCacheError(f"{REMOTE_WRITE_ENV}={raw!r} is not 1 or 0 (publish entries to the remote cache or not)")
    return RemoteTier(url, write=write)
