"""Synthetic GGUF models of real shapes: random weights, for speed, memory and plumbing only — never quality.

    >>> from ridgefill import synthetic
    >>> synthetic.write(synthetic.SPECS["llama-3.1-8b"], "llama8b.gguf", "q4_0")   # streamed, ~4.6 GB
    >>> synthetic.maps_bytes(synthetic.SPECS["llama-3.1-8b"].shape, 16, "q8_0")    # what its maps weigh

Every shape, width, head count, RoPE setting and context length is that of the published model (see SPECS);
the weights are random.  A map fitted on such a model, a TTFT or a memory figure measured on it, says what the
real model costs — how much memory, time and disk — and that the engine runs it; it says nothing about
quality (R², KL, needle accuracy), which needs trained weights.

Weights: every matrix is uniform with standard deviation 1/sqrt(fan_in) (fan_in = its row length, d for
token_embd), so each projection of a normalised input has unit variance, and norm weights are 1 ± 0.1; the
residual stream grows about linearly with depth and logits stay O(1): activations are finite through all layers.
Matrices are written as users run them — q8_0, q4_0 (quantised by gguf-py, `gguf.quants.quantize`; it cannot
write k-quants), f16 or f32 — every matrix in that type (llama-quantize would keep the head in q6_K: a q4_0
file here is a few % smaller than a real Q4_0 one); norms and RoPE factors are float32.  Data are generated
and written block by block, so an 8B-shaped file never sits in RAM.

Tokenizer: every file carries SmolLM2-135M's (its tokenizer.* keys, copied from the GGUF that
`ridgefill.models.fetch("smollm2-135m")` returns: 49,152 tokens, gpt2 BPE).  A shape with a larger
vocabulary (Llama 3: 128,256; Qwen3: 151,936; Gemma 3: 262,144) gets the other ids as unused "[PAD<id>]"
tokens (type UNUSED, as convert_hf_to_gguf pads a vocabulary), so token_embd and the output head have the real
model's size, bytes and FLOPs while text tokenizes with SmolLM2's tokens only.  The tiny test shapes keep
49,152.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import (GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter, LlamaFileType,
                  RopeScalingType, TokenType)
from gguf.quants import quant_shape_to_byte_shape, quantize
from tqdm import tqdm

from .bench import Shape
from .errors import RidgefillError
from .ggufio import MAP_TYPES, _AtomicOutput, add_fields, read_fields
from .modelfile import open_gguf

MODEL_TYPES = {"f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
               "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
               "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
               "q4_0": (GGMLQuantizationType.Q4_0, LlamaFileType.MOSTLY_Q4_0)}
BLOCK_ELEMENTS = 1 << 23      # values generated per block (32 MiB as float32)


@dataclass(frozen=True)
class Spec:
    """One model configuration: its shape (ridgefill.bench.Shape) plus what the architecture needs."""
    name: str
    arch: str                                   # llama | qwen3 | gemma3
    shape: Shape
    rope_base: float
    rms_eps: float
    tied: bool                                  # the output head is token_embd (no output.weight)
    llama3_rope: tuple[float, float, float, int] | None = None  # factor, low/high freq factor, original context
    rope_linear: float | None = None            # linear RoPE scaling (gemma3: global layers)
    swa: tuple[int, float] | None = None        # gemma3: sliding window, RoPE base of the sliding layers
    source: str = ""                            # the published config it copies


# Published configs (Hugging Face config.json of each model; Gemma 3: text_config of gemma-3-4b-it):
#  Llama-3.2-1B  hidden 2048, 16 layers, 32 heads, 8 kv heads, head_dim 64, ffn 8192, vocab 128256,
#                rope_theta 500000 with llama3 scaling (factor 32, low 1, high 4, original 8192), 131072
#                positions, rms_norm_eps 1e-5, tied embeddings.
#  Llama-3.1-8B  hidden 4096, 32 layers, 32 heads, 8 kv heads, head_dim 128, ffn 14336, vocab 128256,
#                rope_theta 500000, llama3 scaling factor 8 (low 1, high 4, original 8192), 131072 positions,
#                rms_norm_eps 1e-5, untied head.
#  Qwen3-8B      hidden 4096, 36 layers, 32 heads, 8 kv heads, head_dim 128, ffn 12288, vocab 151936,
#                rope_theta 1e6, no scaling, 40960 positions, rms_norm_eps 1e-6, q/k norms, untied head.
#  Gemma-3-4B    hidden 2560, 34 layers, 8 heads, 4 kv heads, head_dim 256, ffn 10240, rope_theta 1e6 with
#                linear scaling 8 (global layers), local base 10000, sliding_window 1024, 5 sliding : 1 global,
#                131072 positions, rms_norm_eps 1e-6, q/k norms and post-norms, tied embeddings; vocab
#                262144 (config 262208; the GGUF conversion drops the image-token rows).
HF = "https://huggingface.co/{}/blob/main/config.json"
SPECS: dict[str, Spec] = {s.name: s for s in (
    Spec("llama-3.2-1b", "llama", Shape(16, 2048, 32, 8, 64, 8192, 128256, 131072), 500000.0, 1e-5, True,
         llama3_rope=(32.0, 1.0, 4.0, 8192), source=HF.format("meta-llama/Llama-3.2-1B")),
    Spec("llama-3.1-8b", "llama", Shape(32, 4096, 32, 8, 128, 14336, 128256, 131072), 500000.0, 1e-5, False,
         llama3_rope=(8.0, 1.0, 4.0, 8192), source=HF.format("meta-llama/Llama-3.1-8B")),
    Spec("qwen3-8b", "qwen3", Shape(36, 4096, 32, 8, 128, 12288, 151936, 40960), 1e6, 1e-6, False,
         source=HF.format("Qwen/Qwen3-8B")),
    Spec("gemma3-4b", "gemma3", Shape(34, 2560, 8, 4, 256, 10240, 262144, 131072), 1e6, 1e-6, True,
         rope_linear=8.0, swa=(1024, 10000.0), source=HF.format("google/gemma-3-4b-it")),
    # tiny variants for tests: the same architectures and features, a few layers, small widths
    Spec("tiny-llama", "llama", Shape(6, 256, 4, 2, 64, 768, 49152, 8192), 500000.0, 1e-5, True,
         llama3_rope=(8.0, 1.0, 4.0, 1024)),
    Spec("tiny-qwen3", "qwen3", Shape(6, 256, 4, 2, 64, 768, 49152, 8192), 1e6, 1e-6, False),
    Spec("tiny-gemma3", "gemma3", Shape(8, 256, 2, 1, 256, 768, 49152, 8192), 1e6, 1e-6, True,
         rope_linear=8.0, swa=(64, 10000.0)),
)}


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]          # numpy order: (rows, row length); ggml's ne is the reverse
    qtype: GGMLQuantizationType
    kind: str                       # weight | norm | rope_freqs

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.qtype)


def tensor_nbytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    return math.prod(quant_shape_to_byte_shape(shape, qtype))


def model_type(name: str) -> tuple[GGMLQuantizationType, LlamaFileType]:
    if name not in MODEL_TYPES:
        raise RidgefillError(f"type {name!r}: choose one of {', '.join(MODEL_TYPES)}")
    return MODEL_TYPES[name]


def tensor_plan(spec: Spec, type_name: str = "q8_0") -> list[TensorPlan]:
    """Every tensor of the model, in file order, as llama.cpp's loader expects them for spec.arch."""
    s, qtype = spec.shape, model_type(type_name)[0]
    f32 = GGMLQuantizationType.F32
    q, kv = s.n_head * s.head_dim, s.n_kv * s.head_dim
    mat = lambda name, rows, cols: TensorPlan(name, (rows, cols), qtype, "weight")  # noqa: E731
    vec = lambda name, n, kind="norm": TensorPlan(name, (n,), f32, kind)              # noqa: E731
    out = [mat("token_embd.weight", s.n_vocab, s.d)]
    if spec.llama3_rope:
        out.append(vec("rope_freqs.weight", s.head_dim // 2, "rope_freqs"))
    out.append(vec("output_norm.weight", s.d))
    if not spec.tied:
        out.append(mat("output.weight", s.n_vocab, s.d))
    qk_norm, post_norm = spec.arch in ("qwen3", "gemma3"), spec.arch == "gemma3"
    for i in range(s.n_layer):
        b = f"blk.{i}."
        out += [vec(b + "attn_norm.weight", s.d), mat(b + "attn_q.weight", q, s.d),
                mat(b + "attn_k.weight", kv, s.d), mat(b + "attn_v.weight", kv, s.d),
                mat(b + "attn_output.weight", s.d, q)]
        if qk_norm:
            out += [vec(b + "attn_q_norm.weight", s.head_dim), vec(b + "attn_k_norm.weight", s.head_dim)]
        if post_norm:
            out.append(vec(b + "post_attention_norm.weight", s.d))
        out += [vec(b + "ffn_norm.weight", s.d), mat(b + "ffn_gate.weight", s.d_ff, s.d),
                mat(b + "ffn_up.weight", s.d_ff, s.d), mat(b + "ffn_down.weight", s.d, s.d_ff)]
        if post_norm:
            out.append(vec(b + "post_ffw_norm.weight", s.d))
    return out


def model_bytes(spec: Spec, type_name: str = "q8_0") -> int:
    """Tensor data of the model file (the file adds its header: keys and tokenizer, about 2 MB)."""
    return sum(t.nbytes for t in tensor_plan(spec, type_name))


def maps_bytes(shape: Shape, split_layer: int, map_type: str = "q8_0") -> int:
    """Tensor data of the maps of one split layer: per late layer (split_layer+1 .. n_layer-1) a d×d weight in
    `map_type` and a float32 bias of d.  The map file adds its header (keys and diagnostics: a few KiB)."""
    if map_type not in MAP_TYPES:
        raise RidgefillError(f"map type {map_type!r}: choose one of {', '.join(MAP_TYPES)}")
    if not 1 <= split_layer <= shape.n_layer - 1:
        raise RidgefillError(f"split layer {split_layer} outside 1..{shape.n_layer - 1}")
    late = shape.n_layer - split_layer - 1
    return late * (tensor_nbytes((shape.d, shape.d), MAP_TYPES[map_type]) + 4 * shape.d)


def llama3_rope_factors(head_dim: int, base: float, factor: float, low: float, high: float, ctx: int) -> np.ndarray:
    """rope_freqs.weight of a Llama 3.x model, as convert_hf_to_gguf computes it from rope_scaling."""
    freqs = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    smooth = (ctx / wavelen - low) / (high - low)
    out = np.where(wavelen < ctx / high, 1.0,
                   np.where(wavelen > ctx / low, factor, 1 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)


def _values(spec: Spec, t: TensorPlan, rng: np.random.Generator):
    """float32 blocks of whole rows of tensor t, in order."""
    if t.kind == "rope_freqs":
        yield llama3_rope_factors(spec.shape.head_dim, spec.rope_base, *spec.llama3_rope)
        return
    rows, cols = (1, t.shape[0]) if len(t.shape) == 1 else t.shape
    half = math.sqrt(3.0) * (0.1 if t.kind == "norm" else 1 / math.sqrt(cols))   # uniform(-a, a): std a/√3
    step = max(1, BLOCK_ELEMENTS // cols)
    for r in range(0, rows, step):
        x = rng.random((min(step, rows - r), cols), dtype=np.float32)
        x *= 2 * half
        x -= half if t.kind == "weight" else half - 1.0
        yield x.reshape(-1) if len(t.shape) == 1 else x


class _Generated:
    """One tensor's data as GGUFWriter.write_tensor_data wants it (nbytes, tofile), generated block by block."""

    def __init__(self, spec: Spec, t: TensorPlan, rng: np.random.Generator):
        self.spec, self.t, self.rng, self.nbytes = spec, t, rng, t.nbytes

    def tofile(self, f) -> None:
        for block in _values(self.spec, self.t, self.rng):
            quantize(block, self.t.qtype).tofile(f)


@lru_cache(maxsize=1)
def tokenizer_fields() -> tuple[list, list[str], list[int]]:
    """SmolLM2-135M's tokenizer: its tokenizer.* keys but the token list, the tokens, their types.

    Read from $RIDGEFILL_TOKENIZER_GGUF when set (a file from write_tokenizer, for machines that cannot fetch
    the model), else from the GGUF that ridgefill.models.fetch("smollm2-135m") returns."""
    import os

    from . import models
    r = open_gguf(os.environ.get("RIDGEFILL_TOKENIZER_GGUF") or models.fetch("smollm2-135m"))
    if "tokenizer.ggml.scores" in r.fields:
        raise RidgefillError("the tokenizer has scores; synthetic.add_tokenizer pads tokens and types only")
    tokens, types = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"
    keys = read_fields(r, keep=lambda k: k.startswith("tokenizer.") and k not in (tokens, types))
    return keys, list(r.fields[tokens].contents()), list(r.fields[types].contents())


def add_tokenizer(w: GGUFWriter, n_vocab: int) -> None:
    """SmolLM2's tokenizer, its token list padded with unused "[PAD<id>]" tokens up to n_vocab."""
    keys, tokens, types = tokenizer_fields()
    if n_vocab < len(tokens):
        raise RidgefillError(f"n_vocab {n_vocab} is below the {len(tokens)} tokens of the tokenizer")
    add_fields(w, keys)
    extra = range(len(tokens), n_vocab)
    w.add_token_list(tokens + [f"[PAD{i}]" for i in extra])
    w.add_token_types(types + [int(TokenType.UNUSED)] * len(extra))


def add_keys(w: GGUFWriter, spec: Spec, type_name: str) -> None:
    s = spec.shape
    w.add_type("model")
    w.add_name(f"RidgeFill synthetic {spec.name}")
    w.add_description(f"RidgeFill synthetic model of the shape of {spec.name} ({spec.source or 'test shape'}): "
                      "random weights, for speed, memory and plumbing only, never quality")
    w.add_file_type(model_type(type_name)[1])
    w.add_quantization_version(GGML_QUANT_VERSION)
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.d)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.d_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(spec.rope_base)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_vocab_size(s.n_vocab)
    if spec.rope_linear:
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(spec.rope_linear)
    if spec.swa:
        w.add_sliding_window(spec.swa[0])
        w.add_rope_freq_base_swa(spec.swa[1])
    add_tokenizer(w, s.n_vocab)


def write(spec: Spec | str, path: str | Path, type_name: str = "q8_0", *, seed: int = 0,
          weights: bool = True, progress: bool = False) -> Path:
    """Write a synthetic model of `spec` (random weights: speed, memory and plumbing only, never quality).

    weights=False writes the header and leaves the tensor data as zeros in a sparse file (no time, no disk):
    the exact file size, names, shapes and metadata, for checks and size figures.
    """
    spec = SPECS[spec] if isinstance(spec, str) else spec
    plan = tensor_plan(spec, type_name)
    path = Path(path)
    with _AtomicOutput(path) as tmp:
        w = GGUFWriter(tmp, arch=spec.arch)
        add_keys(w, spec, type_name)
        for t in plan:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        if weights:
            for i, t in enumerate(tqdm(plan, unit="tensor", desc=spec.name, disable=not progress)):
                w.write_tensor_data(_Generated(spec, t, np.random.default_rng([seed, i])))
            w.close()
        else:
            w.close()
            pad = lambda n: -(-n // w.data_alignment) * w.data_alignment  # noqa: E731
            with open(tmp, "r+b") as f:
                f.truncate(pad(tmp.stat().st_size) + sum(pad(t.nbytes) for t in plan))
    return path


def write_tokenizer(path: str | Path) -> Path:
    """A tensor-less GGUF holding only the tokenizer the synthetic models carry (~2 MB; see tokenizer_fields)."""
    keys, tokens, types = tokenizer_fields()
    path = Path(path)
    with _AtomicOutput(path) as tmp:
        w = GGUFWriter(tmp, arch="llama")
        add_fields(w, keys)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.close()
    return path


def write_maps(model: str | Path, split_layer: int, path: str | Path, map_type: str = "f16", *,
               seed: int = 0) -> Path:
    """Maps for a synthetic model without calibrating it: small random W (std 0.01/sqrt(d)) and zero biases, with
    the model's fingerprint, so that the runtime loads them.  Speed, memory and plumbing only: a fill with them
    is not an approximation of anything."""
    from .ggufio import MapFile, fingerprint, write_maps as write_map_file
    r = open_gguf(model)
    shape = Shape.of(model)
    if not 1 <= split_layer <= shape.n_layer - 1:
        raise RidgefillError(f"split layer {split_layer} outside 1..{shape.n_layer - 1}")
    late = range(split_layer + 1, shape.n_layer)
    rng = np.random.default_rng(seed)
    scale = 0.01 / math.sqrt(shape.d)
    m = MapFile(arch=str(bytes(r.get_field("general.architecture").parts[-1]), "utf-8"), n_layer=shape.n_layer,
                split_layer=split_layer, prior="synthetic", ridge_lambda=np.zeros(len(late)), calib_tokens=0,
                sink_tokens=4, base_fingerprint=fingerprint(r), map_type=map_type,
                weights={l: (rng.standard_normal((shape.d, shape.d), dtype=np.float32) * scale) for l in late},
                biases={l: np.zeros(shape.d, np.float32) for l in late})
    del r
    write_map_file(path, m)
    return Path(path)
