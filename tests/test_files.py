"""Outputs (nbjit.files.write_output): a file replaced whole or not at all, a device or FIFO
written through, and a path that names an open descriptor (/dev/stdout, /dev/fd/N,
/proc/self/fd/N) written through that descriptor: never a file renamed over what the shell
redirected it to."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import nbjit
from nbjit.files import write_output

from conftest import DATA  # noqa: E402

ROOT = Path(nbjit.__file__).parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
NBJIT = f"{sys.executable} -m nbjit"


def shell(command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=180,
                          env={**ENV, **env})


PTX = DATA / "nvcc/kernels_G_sm90.ptx"


@pytest.mark.parametrize("target", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "link-to-stdout"])
def test_strip_to_standard_output_appends_to_the_redirected_file(tmp_path, target):
    log = tmp_path / "log"
    log.write_text("earlier line\n")
    os.link(log, tmp_path / "hard-link")
    inode = log.stat().st_ino
    if target == "link-to-stdout":
        (tmp_path / target).symlink_to("/dev/stdout")
    r = shell(f"{NBJIT} strip {PTX} -o {target} >> log", tmp_path)
    assert r.returncode == 0, r.stderr
    text = log.read_text()
    assert text.startswith("earlier line\n") and ".version" in text  # the log kept, the PTX after it
    assert log.stat().st_ino == inode and (tmp_path / "hard-link").read_text() == text  # the same file
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".nbjit-")]


def test_an_output_to_standard_error_appends_to_its_file(tmp_path):
    log = tmp_path / "err.log"
    log.write_text("earlier\n")
    r = shell(f"{NBJIT} strip {PTX} -o /dev/stderr 2>> err.log", tmp_path)
    assert r.returncode == 0
    assert log.read_text().startswith("earlier\n") and ".version" in log.read_text()


@pytest.mark.parametrize("verb", ["compile", "bundle", "cache export"])
def test_each_verb_writes_through_standard_output(tmp_path, verb):
    if verb == "compile":
        from nbjit.toolchain.nvrtc import nvrtc_version
        try:
            nvrtc_version()
        except Exception:
            pytest.skip("NVRTC is not installed")
    log = tmp_path / "log"
    log.write_bytes(b"kept\n")
    args = {"compile": f"compile {DATA / 'src/spill.cu'} --arch sm_90",
            "bundle": f"bundle {DATA / 'nvcc/kernels_sm90.ptx'}",
            "cache export": "cache export"}[verb]
    r = shell(f"{NBJIT} {args} {'/dev/stdout' if verb == 'cache export' else '-o /dev/stdout'} >> log", tmp_path,
              NBJIT_CACHE_DIR=str(tmp_path / "cache"))
    assert r.returncode == 0, r.stderr
    assert log.read_bytes().startswith(b"kept\n") and len(log.read_bytes()) > 5


def test_a_process_killed_while_writing_leaves_no_temporary_file(tmp_path):
    """Where the system has unnamed files (Linux's O_TMPFILE), the output has no name until
    it is whole: a SIGKILL mid-write leaves nothing beside the destination."""
    code = ("import os, signal\nfrom nbjit.files import write_output\n"
            "def write(f):\n    f.write(b'x' * 100000)\n    f.flush()\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            f"write_output({str(tmp_path / 'out.tar.gz')!r}, write)\n")
    r = subprocess.run([sys.executable, "-c", code], env=ENV, timeout=60)
    assert r.returncode == -signal.SIGKILL
    if not hasattr(os, "O_TMPFILE"):
        pytest.skip("no O_TMPFILE here: the named temporary is left")
    assert os.listdir(tmp_path) == []


def test_a_regular_file_is_still_replaced_whole_keeping_its_mode(tmp_path):
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")
    out.chmod(0o640)
    write_output(out, lambda f: f.write(b"new"))
    assert out.read_bytes() == b"new" and (out.stat().st_mode & 0o777) == 0o640
    with pytest.raises(FileNotFoundError, match="no directory"):
        write_output(tmp_path / "missing" / "x", lambda f: f.write(b""))
    assert sorted(os.listdir(tmp_path)) == ["out.bin"]


def test_a_descriptor_that_is_not_open_is_an_error(tmp_path):
    if not shutil.which("bash"):
        pytest.skip("no bash")
    r = shell(f"{NBJIT} strip {PTX} -o /dev/fd/9", tmp_path)
    assert r.returncode == 2 and "cannot write /dev/fd/9" in r.stderr and "Traceback" not in r.stderr, r.stderr
