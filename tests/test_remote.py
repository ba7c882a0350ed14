"""The remote tier of the cache against a real S3-compatible server on loopback (moto's
server mode, through s3fs), with real NVRTC compiles."""
from __future__ import annotations

import json
import logging
import os
import pickle
import re
import socket
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest

from nbjit import NbjitCacheError, NbjitWarning, RemoteTier, compile_image
from nbjit.cache.store import Cache
from nbjit.cache.entries import _decode

pytest.importorskip("s3fs", reason="the remote tier's tests need s3fs (pip install 'nbjit-core[test]')")
moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (pip install 'nbjit-core[test]')")

ROOT = str(Path(__file__).resolve().parent.parent)
SECRET = "nbjit-test-secret-0123456789abcdef"  # a credential that must never be shown
SRC = 'extern "C" __global__ void k(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = SCALE * i; }\n'


class S3:
    """A moto S3 server on 127.0.0.1 (a free port), with one bucket."""

    def __init__(self):
        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.env = {"AWS_ACCESS_KEY_ID": "nbjit-test-key-id", "AWS_SECRET_ACCESS_KEY": SECRET,
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint}
        import boto3
        self.client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="nbjit-test-key-id",
                                   aws_secret_access_key=SECRET, region_name="us-east-1")
        self.client.create_bucket(Bucket="fleet")
        self.stopped = False

    def tier(self, prefix: str, **kw) -> RemoteTier:
        return RemoteTier(f"s3://fleet/{prefix}", options={"endpoint_url": self.endpoint}, **kw)

    def objects(self, prefix: str) -> dict[str, bytes]:
        listed = self.client.list_objects_v2(Bucket="fleet", Prefix=prefix + "/").get("Contents", [])
        return {o["Key"]: self.client.get_object(Bucket="fleet", Key=o["Key"])["Body"].read() for o in listed}

    def stop(self):
        if not self.stopped:
            self.stopped = True
            self.server.stop()


@pytest.fixture
def s3(monkeypatch):
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    server = S3()
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def prefix(request):
    return request.node.name.replace("[", "-").replace("]", "")


def build(cache, scale=2, source=SRC):
    return compile_image(source, name="k.cu", options=[f"-DSCALE={scale}"], arch="sm_90", cache=cache)


def entry_bytes(cache: Cache) -> dict[str, bytes]:
    return {f.stem: f.read_bytes() for f, _, _ in cache.entries()}


def test_a_miss_compiles_and_publishes_the_local_entry(tmp_path, s3, prefix, counted):
    c = Cache(tmp_path / "a", remote=s3.tier(prefix))
    img = build(c)
    assert len(counted) == 1
    local = entry_bytes(c)
    (key, data), = local.items()
    assert s3.objects(prefix) == {f"{prefix}/{key[:2]}/{key}.nbjit": data}  # the same bytes as the local file
    assert _decode(data, key)[0].payload == img.data
    assert c.remote.listing() == [(key, len(data))]
    # a second machine's compile of the same source finds it there: nothing is written twice
    again = Cache(tmp_path / "b", remote=s3.tier(prefix))
    assert build(again).data == img.data and len(counted) == 1
    assert not again.remote.put(key, data)  # looked for before writing: the first publisher won


FRESH = textwrap.dedent(r'''
    import json, sys
    sys.path.insert(0, sys.argv[3])
    import nbjit.toolchain.nvrtc as C
    from nbjit.cache.store import Cache
    def refused(*a, **k):
        raise SystemExit("NVRTC was called")
    C._run_nvrtc = refused
    img = C.compile_image(sys.argv[4], name="k.cu", options=["-DSCALE=2"], arch="sm_90",
                          cache=Cache(sys.argv[1], remote=sys.argv[2]))
    print(json.dumps({"data": img.data.hex(), "log": img.log}))
''')


def test_a_fresh_process_is_served_by_the_remote_without_nvrtc(tmp_path, s3, prefix, counted):
    img = build(Cache(tmp_path / "a", remote=s3.tier(prefix)))
    env = {**os.environ, **s3.env}
    r = subprocess.run([sys.executable, "-c", FRESH, str(tmp_path / "fresh"), f"s3://fleet/{prefix}", ROOT, SRC],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert bytes.fromhex(json.loads(r.stdout)["data"]) == img.data
    assert entry_bytes(Cache(tmp_path / "fresh")) == entry_bytes(Cache(tmp_path / "a"))  # kept locally too
    assert len(counted) == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "other key"])
def test_a_corrupt_object_is_refused_recompiled_and_republished(tmp_path, s3, prefix, counted, damage):
    img = build(Cache(tmp_path / "a", remote=s3.tier(prefix)))
    (name, good), = s3.objects(prefix).items()
    if damage == "flip":
        bad = bytearray(good)
        bad[-10] ^= 0xFF
    elif damage == "truncate":
        bad = good[: len(good) // 2]
    else:  # a whole, valid entry of another key, filed under this one
        build(Cache(tmp_path / "o", remote=s3.tier(prefix + "-other")), scale=3)
        bad = next(iter(s3.objects(prefix + "-other").values()))
    s3.client.put_object(Bucket="fleet", Key=name, Body=bytes(bad))
    c = Cache(tmp_path / "b", remote=s3.tier(prefix))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = build(c)
    assert got.data == img.data and len(counted) == 2 + (damage == "other key")  # compiled here, not loaded
    said = [str(x.message) for x in w if issubclass(x.category, NbjitWarning)]
    assert len(said) == 1 and "corrupt" in said[0] and name in said[0], said
    assert s3.objects(prefix)[name] == good  # republished over the bad object
    assert build(Cache(tmp_path / "c", remote=s3.tier(prefix))).data == img.data and \
        len(counted) == 2 + (damage == "other key")


def test_a_stopped_server_costs_one_warning_and_no_compile(tmp_path, s3, prefix, counted):
    c = Cache(tmp_path / "a", remote=s3.tier(prefix, timeout=2.0, failures=3, cooldown=3600))
    build(c, scale=1)
    s3.stop()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        images = [build(c, scale=s) for s in range(2, 8)]
    assert len(counted) == 7 and all(i.kind == "cubin" for i in images)
    said = [str(x.message) for x in w if issubclass(x.category, NbjitWarning)]
    assert len(said) == 1 and "s3://fleet/" in said[0] and "local cache only" in said[0], said
    assert SECRET not in said[0]
    assert len(Cache(tmp_path / "a").entries()) == 7  # the local cache went on as before


class Silent:
    """A server that accepts connections and never answers (a store that hangs)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def test_a_store_that_never_answers_is_given_up(tmp_path, counted):
    silent = Silent()
    try:
        tier = RemoteTier("s3://fleet/x", timeout=0.5, failures=1, cooldown=3600,
                          options={"endpoint_url": f"http://127.0.0.1:{silent.sock.getsockname()[1]}",
                                   "key": "nbjit-test-key-id", "secret": SECRET})
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            img = build(Cache(tmp_path / "a", remote=tier))
            build(Cache(tmp_path / "b", remote=tier), scale=3)  # left alone: no second wait, no second warning
    finally:
        silent.close()
    said = [str(x.message) for x in w if issubclass(x.category, NbjitWarning)]
    assert img.kind == "cubin" and len(counted) == 2
    assert len(said) == 1 and "no answer in 0.5 s" in said[0] and SECRET not in said[0], said


FLEET = textwrap.dedent(r'''
    import json, sys, time
    sys.path.insert(0, sys.argv[4])
    import nbjit.toolchain.nvrtc as C
    from nbjit.cache.store import Cache
    real = C._run_nvrtc
    def counted(req):
        with open(sys.argv[2], "a") as f:
            f.write("compiled\n")
        time.sleep(0.3)  # long enough for the others to arrive and wait
        return real(req)
    C._run_nvrtc = counted
    img = C.compile_image(sys.argv[5], name="k.cu", options=["-DSCALE=2"], arch="sm_90",
                          cache=Cache(sys.argv[1], remote=sys.argv[3]))
    print(img.data.hex(), flush=True)
''')


def test_eight_processes_on_two_machines_compile_once_per_machine_at_most(tmp_path, s3, prefix):
    env = {**os.environ, **s3.env}
    procs = []
    for i in range(8):
        machine = tmp_path / f"machine{i % 2}"
        procs.append(subprocess.Popen(
            [sys.executable, "-c", FLEET, str(machine / "cache"), str(tmp_path / f"marker{i % 2}"),
             f"s3://fleet/{prefix}", ROOT, SRC], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        outs.append(out.strip())
    per_machine = [(tmp_path / f"marker{m}").read_text().count("compiled") if (tmp_path / f"marker{m}").exists()
                   else 0 for m in (0, 1)]
    assert max(per_machine) <= 1 and sum(per_machine) >= 1, per_machine
    reference = build(Cache(None)).data  # compiled here, with no cache at all
    assert set(outs) == {reference.hex()}  # no wrong byte served, anywhere
    (name, data), = s3.objects(prefix).items()
    assert _decode(data, name.rsplit("/", 1)[1][:-6])[0].payload == reference
    for m in (0, 1):
        assert entry_bytes(Cache(tmp_path / f"machine{m}" / "cache")) == {name.rsplit("/", 1)[1][:-6]: data}


def test_a_read_only_consumer_publishes_nothing(tmp_path, s3, prefix, counted):
    c = Cache(tmp_path / "a", remote=s3.tier(prefix), remote_write=False)
    build(c)
    assert len(counted) == 1 and s3.objects(prefix) == {}
    assert c.info()["remote"] == f"s3://fleet/{prefix}" and c.info()["remote_write"] is False
    with pytest.raises(NbjitCacheError, match="read-only"):
        c.push()


def test_cli_push_pull_info_list_and_no_credentials_shown(tmp_path, s3, prefix):
    env = {**os.environ, **s3.env, "NBJIT_CACHE_DIR": str(tmp_path / "a"),
           "NBJIT_CACHE_REMOTE": f"s3://fleet/{prefix}", "NBJIT_CACHE_REMOTE_WRITE": "0"}
    src = tmp_path / "k.cu"
    src.write_text(SRC)
    run = lambda *a, **e: subprocess.run([sys.executable, "-m", "nbjit", *a], capture_output=True, text=True,
                                         env={**env, **e}, cwd=ROOT, timeout=120)
    seen = []

    def ok(r, code=0):
        seen.append(r.stdout + r.stderr)
        assert r.returncode == code, r.stderr
        return r.stdout

    for scale in (1, 2):
        ok(run("compile", str(src), "--arch", "sm_90", "--cache-only", "-D", f"SCALE={scale}"))
    assert s3.objects(prefix) == {}  # NBJIT_CACHE_REMOTE_WRITE=0: a read-only consumer
    assert "published 2 entries" in ok(run("cache", "push", NBJIT_CACHE_REMOTE_WRITE="1"))
    assert "published 0 entries" in ok(run("cache", "push", NBJIT_CACHE_REMOTE_WRITE="1"))
    assert len(s3.objects(prefix)) == 2
    info = ok(run("cache", "info"))
    assert f"remote:   s3://fleet/{prefix} (read-only): 2 entries" in info
    listed = ok(run("cache", "list")).splitlines()
    assert len(listed) == 4 and sum("remote and local" in line for line in listed) == 2
    pulled = ok(run("cache", "pull", NBJIT_CACHE_DIR=str(tmp_path / "b")))
    assert "pulled 2 new entries" in pulled
    assert entry_bytes(Cache(tmp_path / "b")) == entry_bytes(Cache(tmp_path / "a"))
    rows = json.loads(ok(run("cache", "list", "--json", NBJIT_CACHE_DIR=str(tmp_path / "b"))))
    assert sorted(r["where"] for r in rows) == ["local", "local", "remote", "remote"]
    # a corrupt object is refused by pull, named, and the exit status says so
    name = sorted(s3.objects(prefix))[0]
    s3.client.put_object(Bucket="fleet", Key=name, Body=b"NBJITC\0\1 not an entry")
    r = run("cache", "pull", NBJIT_CACHE_DIR=str(tmp_path / "c"))
    ok(r, code=1)
    assert "pulled 1 new entry" in r.stdout and "refused" in r.stderr and "truncated header" in r.stderr
    # the server gone: info says so, push is an error naming the store; nothing shows a credential
    s3.stop()
    assert "cannot list the remote cache" in ok(run("cache", "info"))
    r = run("cache", "push", NBJIT_CACHE_REMOTE_WRITE="1")
    ok(r, code=2)
    assert r.stderr.startswith(f"nbjit cache: error: cannot publish to s3://fleet/{prefix}/") and \
        len(r.stderr.splitlines()) == 1, r.stderr
    assert "_Unavailable" not in r.stderr  # (the store's own error, not the class nbjit wraps it in)
    assert not any(SECRET in text for text in seen)


def test_credentials_in_a_url_or_options_are_never_shown(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="nbjit")
    tier = RemoteTier(f"https://user:{SECRET}@127.0.0.1:9/cache?sig={SECRET}x", timeout=0.5, failures=1,
                      options={"headers": {"Authorization": f"Bearer {SECRET}"}, "client_kwargs": {"token": SECRET}})
    c = Cache(tmp_path, remote=tier)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        build(c)
    shown = [repr(tier), repr(c), json.dumps(c.info()), caplog.text] + [str(x.message) for x in w]
    assert tier.url == "https://127.0.0.1:9/cache" and len(w) == 1
    assert not any(SECRET in s or "user" in s for s in shown), shown
    with pytest.raises(TypeError, match="credentials"):
        pickle.dumps(tier)


def test_a_directory_tier_publishes_by_renaming(tmp_path, counted):
    shared = tmp_path / "shared"
    shared.mkdir()
    img = build(Cache(tmp_path / "a", remote=shared))  # a path: file:// (a shared mount)
    assert [p.name for p in shared.rglob("*") if p.is_file()] == [f.name for f, _, _ in Cache(tmp_path / "a").entries()]
    assert not list(shared.rglob(".tmp-*"))
    assert build(Cache(tmp_path / "b", remote=shared.as_uri())).data == img.data and len(counted) == 1
    assert Cache(tmp_path / "c", remote=shared.as_uri()).pull() == (1, [])
    # a directory that is not there is a mistyped URL, not an empty cache: pull and list say so
    # (an empty directory is an empty cache)
    typo = (tmp_path / "sahred").as_uri()
    with pytest.raises(NbjitCacheError, match=rf"^the remote cache {re.escape(typo)}: no such directory"):
        Cache(tmp_path / "d", remote=typo).pull()
    (tmp_path / "empty").mkdir()
    assert Cache(tmp_path / "d", remote=tmp_path / "empty").pull() == (0, [])


@pytest.mark.parametrize("remote, msg", [
    ("s3:/fleet/team", r"^the remote cache 's3:/fleet/team' is neither a URL \(s3://bucket/prefix, gs://\.\.\., "
     r"file:///dir\) nor an existing directory: did you mean s3://fleet/team\?$"),
    ("notaurl", r"^the remote cache 'notaurl' is neither a URL .* nor an existing directory$"),
    ("{tmp}/missing", r"^the remote cache '.*/missing' is neither a URL .* nor an existing directory$"),
    ("file://{tmp}/missing", r"^the remote cache file://.*/missing: no such directory"),
])
@pytest.mark.parametrize("how", ["cache", "env", "cli"])
def test_a_remote_that_is_no_url_nor_directory_is_refused_before_writing(tmp_path, monkeypatch, remote, msg, how):
    """A remote cache is a URL of a scheme fsspec knows or an existing directory: a mistyped URL
    (one slash) or a plain word once made a local directory of that name and published there."""
    from nbjit.cache.store import default_cache, set_default_cache
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    remote = remote.format(tmp=tmp_path)
    local = Cache(tmp_path / "local")
    build(local)
    if how == "cache":
        with pytest.raises(NbjitCacheError, match=msg):
            Cache(tmp_path / "local", remote=remote)
    elif how == "env":
        monkeypatch.setenv("NBJIT_CACHE_REMOTE", remote)
        set_default_cache(None)
        with pytest.raises(NbjitCacheError, match=msg):
            default_cache()
    else:
        monkeypatch.setenv("NBJIT_CACHE_DIR", str(tmp_path / "local"))
        set_default_cache(None)
        r = subprocess.run([sys.executable, "-m", "nbjit", "cache", "push", "--remote", remote], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
        assert re.match(msg, r.stderr[len("nbjit cache: error: "):].rstrip("\n")), r.stderr
    assert list(here.iterdir()) == [] and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("kwargs, msg", [
    (dict(remote=42), "is a URL"),
    (dict(remote="nope://bucket/x"), "no filesystem for nope://"),
    (dict(remote=""), "is a URL"),
    (dict(remote="https://example.invalid/c", remote_write=True), "read-only"),
    (dict(remote="s3://b/p", remote_write="yes"), "True or False"),
    (dict(remote_write=False), "applies to a cache with a remote"),
    (dict(remote=RemoteTier("s3://b/p"), remote_write=1), "True or False"),
])
def test_remote_settings_that_make_no_sense(tmp_path, kwargs, msg):
    with pytest.raises(NbjitCacheError, match=msg):
        Cache(tmp_path, **kwargs)


@pytest.mark.parametrize("kwargs, msg", [
    (dict(timeout=0), "timeout"), (dict(timeout=True), "timeout"), (dict(failures=0), "failures"),
    (dict(cooldown=-1), "cooldown"), (dict(options=["x"]), "options"),
])
def test_tier_settings_that_make_no_sense(kwargs, msg):
    with pytest.raises(NbjitCacheError, match=msg) as e:
        RemoteTier("s3://b/p", **kwargs)
    assert pickle.loads(pickle.dumps(e.value)).args == e.value.args


def test_the_environment_names_the_default_tier(tmp_path, monkeypatch):
    from nbjit.cache.store import default_cache, set_default_cache
    monkeypatch.setenv("NBJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NBJIT_CACHE_REMOTE", "s3://fleet/team")
    monkeypatch.setenv("NBJIT_CACHE_REMOTE_WRITE", "0")
    set_default_cache(None)
    try:
        c = default_cache()
        assert c.remote.url == "s3://fleet/team" and c.remote.write is False
        monkeypatch.setenv("NBJIT_CACHE_REMOTE_WRITE", "maybe")
        set_default_cache(None)
        with pytest.raises(NbjitCacheError, match="NBJIT_CACHE_REMOTE_WRITE"):
            default_cache()
    finally:
        monkeypatch.delenv("NBJIT_CACHE_REMOTE")
        set_default_cache(None)


def test_an_object_larger_than_an_entry_can_be_is_refused_unread(tmp_path, s3, prefix, caplog):
    """A remote object past the entry limit is a miss found by its size: none of it is read
    (a ranged read fetched the limit's worth of it into memory first, then refused it)."""
    import tracemalloc
    limit, key = 4 << 20, "ab" * 32
    s3.client.put_object(Bucket="fleet", Key=f"{prefix}/{key[:2]}/{key}.nbjit", Body=b"\0" * (limit + 1))
    (tmp_path / key[:2]).mkdir()
    (tmp_path / key[:2] / f"{key}.nbjit").write_bytes(b"\0" * (limit + 1))
    tier, local = s3.tier(prefix), RemoteTier(tmp_path.as_uri())
    with caplog.at_level(logging.INFO, logger="werkzeug"):  # (the S3 server's log of each request)
        assert tier.get(key, limit) is None
    asked = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert asked and not any("GET /" in a for a in asked), asked  # its size asked (HEAD), no byte of it
    assert local.get("cd" * 32, limit) is None  # (a miss: the store's client set up before measuring)
    tracemalloc.start()
    try:
        assert local.get(key, limit) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit // 4, peak
    for t in (tier, local):  # within the limit: read whole
        assert t.get(key, limit + 1) == b"\0" * (limit + 1)
