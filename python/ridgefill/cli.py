"""The `ridgefill` command.

    ridgefill --version                 fork identity: our version, upstream pin, patch series
    ridgefill fetch-models [NAME ...]   download and verify the small test models
    ridgefill calibrate MODEL -s S -o MAPS.gguf   fit ridge maps (one pass over text)
    ridgefill export MODEL MAPS -o OUT.gguf       augmented GGUF: model + maps
    ridgefill info FILE                 ridgefill metadata and diagnostics of a map file
    ridgefill bench MODEL [--maps M]    TTFT exact vs RidgeFill, interleaved, with the analytic limit
    ridgefill eval MODEL --task T       quality exact vs RidgeFill: kl, longdep, needle, splice
    ridgefill sweep MODEL               split layers × tails: the speed–quality frontier
    ridgefill demo [-m MODEL]           the main job on the small model (see README)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__
from .errors import RidgefillError


def _version_text() -> str:
    from ._lib import fork_identity
    ident = fork_identity()
    return (f"ridgefill {ident['version']} (python package {__version__})\n"
            f"upstream: {ident['upstream']}\n"
            f"patches:  {ident['patch_series']}\n"
            f"library:  {ident['library']}")


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, help="print the fork's identity and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            print(_version_text())
        except RidgefillError as e:
            parser.exit(1, f"ridgefill: error: {e}\n")
        parser.exit()


def cmd_fetch_models(args: argparse.Namespace) -> None:
    from . import models
    for name in args.names or list(models.MODELS):
        print(f"{name}: {models.fetch(name)}")


def _lambda(value: str):
    if value == "auto":
        return value
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number, got {value!r}") from None


def cmd_calibrate(args: argparse.Namespace) -> None:
    from .calibrate import CalibConfig, calibrate
    from .ggufio import diagnostics_table
    if args.text and args.corpus:
        raise RidgefillError("give --text FILE or --corpus NAME, not both")
    auto = args.band_full_layers if isinstance(args.band_full_layers, tuple) else None   # ("auto", N or None)
    if auto:
        from .band import full_count
        full_count(args.band_layers, auto[1])
        if args.text:
            raise RidgefillError("--band-full-layers auto chooses on the calibration corpus; with --text files give "
                                 "the layers (L1,L2,..)")
        if args.tokens <= args.band_window + 1024:
            raise RidgefillError(f"--band-full-layers auto measures the 1024-token tail of prompts cut from the "
                                 f"calibration text, past the window: -n {args.tokens} must exceed --band-window "
                                 f"{args.band_window} + 1024")
    cfg = CalibConfig(model=args.model, split_layer=args.split_layer, texts=args.text or [], corpus=args.corpus,
                      tokens=args.tokens, ctx=args.ctx, lam=args.ridge_lambda, prior=args.prior,
                      val_fraction=args.val_fraction, map_type=args.map_type, sink_tokens=args.sink_tokens,
                      threads=args.threads, diag_tokens=args.diag_tokens, progress=not args.no_progress,
                      map_kind=args.map_kind, context_tokens=args.context_tokens, read_order=args.read_order,
                      band_layers=args.band_layers, band_window=args.band_window if args.band_layers else 0,
                      band_full_layers=() if auto else tuple(args.band_full_layers))
    m = calibrate(cfg, args.output)
    print(diagnostics_table(m))
    if auto:
        from .band import choose_and_record
        choice = choose_and_record(args.model, str(args.output), args.band_layers, args.band_window, auto[1],
                                   threads=args.threads, progress=not args.no_progress)
        print(f"band layers left unwindowed, chosen by the tail KL of {len(choice.kl['chosen'])} calibration prompts "
              f"of {choice.length} tokens ({choice.tail_tokens}-token tail):")
        print(choice.table())
        print(f"recorded in {args.output}: band_full_layers {', '.join(map(str, choice.chosen))}")
        if len(choice.kl["chosen"]) < 4:
            print(f"warning: the choice rests on {len(choice.kl['chosen'])} calibration prompt(s) of {choice.length} "
                  "tokens: too few to tell layers apart; calibrate on more text (-n) or give the layers by hand",
                  file=sys.stderr)
        for a, b in choice.unresolved():
            print(f"warning: not told apart: unwindowed {a} (chosen) and {b}: not every one of the "
                  f"{len(choice.kl['chosen'])} prompts puts {a} lower; calibrate on more text (-n) or give the "
                  "layers by hand", file=sys.stderr)
    print(f"wrote {args.output}: {m.map_kind} maps, context_tokens {m.context_tokens}, split_layer {m.split_layer}, "
          f"prior {m.prior}, {m.calib_tokens} fit tokens, {m.extra['val_tokens']} held-out tokens, "
          f"map type {m.map_type}; peak memory {m.extra['peak_rss_mb']:.0f} MB")


def cmd_export(args: argparse.Namespace) -> None:
    from .ggufio import export
    export(args.model, args.maps, args.output)
    print(f"wrote {args.output}")


def cmd_info(args: argparse.Namespace) -> None:
    from .ggufio import info_text
    print(info_text(args.file))


def _write(module, result: dict, args: argparse.Namespace) -> None:
    """--json and --plot of bench, eval and sweep (each module has save() and plot())."""
    if args.json:
        module.save(result, args.json)
    if args.plot:
        module.plot(result, args.plot)
        print(f"wrote {args.plot}")


def cmd_bench(args: argparse.Namespace) -> None:
    from . import bench
    from .modelfile import check_gguf
    if args.compare_maps and (args.server or args.guard_cost):
        raise RidgefillError("--compare-maps runs in-process, exact and each map file rotated: not with "
                             f"{'--server' if args.server else '--guard-cost'}")
    if args.chat is not None:
        if not args.server:
            raise RidgefillError("--chat measures through a server: give --server URL")
        if args.chat < 1 or args.turn_tokens < 1 or args.repeats < 1:
            raise RidgefillError("--chat, --turn-tokens and --repeats must be >= 1")
        print(f"{args.chat}-turn conversation through {args.server}, {args.turn_tokens} new tokens a turn, prompt "
              f"cache on, exact vs RidgeFill in fresh conversations, interleaved, {args.repeats} repeats")
        result = bench.run_chat(args.server, args.chat, args.turn_tokens, args.tail_tokens, args.repeats)
        print(bench.CHAT_HEADER)
        for row in result["rows"]:
            print(bench.format_chat_row(bench.ChatRow(**row)))
        print(f"split layer {result['split_layer']}, tail {result['tail_tokens']}; TTFT = timings.prompt_ms")
        print("\n".join(bench.chat_targets(result)))
        _write(bench, result, args)
        return
    if args.guard_cost:
        if args.server or not args.model:
            raise RidgefillError("--guard-cost runs in-process: give MODEL, not --server")
        if args.plot:
            raise RidgefillError("--guard-cost draws no plot (its table is printed and written with --json)")
        check_gguf(args.model)
        tail = args.tail_tokens or 1024
        print(f"TTFT exact / RidgeFill / RidgeFill+guard, {args.domain} prompts, {args.repeats} rotated repeats, "
              f"tail {tail}")
        result = bench.run_guard(args.model, args.maps, args.lengths, tail, args.sink_tokens, args.repeats,
                                 args.threads, args.domain, period=args.guard_period)
        print(bench.markdown(result))
        _write(bench, result, args)
        return
    if args.server:
        print(f"TTFT exact vs RidgeFill (the fill, guard off) through {args.server}, interleaved, {args.repeats} repeats")
        print(bench.HEADER)
        result = bench.run_server(args.server, args.lengths, args.tail_tokens, args.repeats, args.model)
    else:
        if not args.model:
            raise RidgefillError("give MODEL, or --server URL of a running ridgefill-server")
        check_gguf(args.model)
        tail = args.tail_tokens or 1024
        print(f"TTFT exact vs RidgeFill (the fill, guard off: see --guard-cost), interleaved, {args.repeats} repeats, "
              f"tail {tail}, sink {args.sink_tokens}")
        print(bench.HEADER + (f" {'vs first':>9s}  maps" if args.compare_maps else ""))
        result = bench.run(args.model, args.maps, args.lengths, tail, args.sink_tokens, args.repeats, args.threads,
                           n_gpu_layers=args.n_gpu_layers, flash_attn=args.flash_attn == "on",
                           band_layers=args.band_layers, band_window=args.band_window,
                           band_full_layers=args.band_full_layers, compare=args.compare_maps)
        result.update(n_gpu_layers=args.n_gpu_layers, flash_attn=args.flash_attn)
        if "compare" in result:
            print(bench.compare_markdown(result))
    print(f"split layer {result['split_layer']}; maps take {result['maps_bytes'] / 2**20:.1f} MiB")
    _write(bench, result, args)


def _band_override_args(s) -> None:
    """--band-layers/--band-window of eval and bench: override the band the map file records."""
    s.add_argument("--band-layers", type=int, default=None, metavar="B",
                   help="windowed band: B layers below the split run on filled rows over the sink and a window "
                        "(default: the maps' own; 0: none)")
    s.add_argument("--band-window", type=int, default=None, metavar="W",
                   help="latest positions a band layer of a filled row attends to (default: the maps' own, else "
                        "1024)")
    s.add_argument("--band-full-layers", type=_layer_list, default=None, metavar="L1,L2,..",
                   help="band layers that attend to every position, unwindowed ('none': window the whole band; "
                        "default: the maps' own)")


def _names(value: str) -> list[str]:
    """A comma-separated list (files, domains); empty items dropped."""
    return [x for x in value.split(",") if x]


def _layer_list(value: str) -> list[int]:
    """--band-full-layers: comma-separated layer numbers, or 'none'."""
    return [] if value.strip().lower() in ("none", "") else _ints(value)


def _full_layers(value: str):
    """calibrate --band-full-layers: like _layer_list, or auto[:N] -> ("auto", N or None)."""
    if value.strip().lower().startswith("auto"):
        rest = value.strip()[4:]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            raise argparse.ArgumentTypeError(f"expected auto or auto:N (N a number of layers), got {value!r}")
        return ("auto", int(rest[1:]) if rest else None)
    return _layer_list(value)


def _ints(value: str) -> list[int]:
    try:
        return [int(x) for x in value.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from None


def _floats(value: str) -> list[float]:
    try:
        return [float(x) for x in value.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {value!r}") from None


def cmd_eval(args: argparse.Namespace) -> None:
    from . import evaluate
    tasks = [t for arg in args.task for t in arg.split(",")]
    cfg = evaluate.EvalConfig(model=args.model, maps=args.maps, tasks=tasks, lengths=args.lengths,
                              tail_tokens=args.tail_tokens, sink_tokens=args.sink_tokens, prompts=args.prompts,
                              domains=[] if args.text and not args.domains_given else args.domains,
                              texts=args.text or [], depths=args.depths, needle_trials=args.needle_trials,
                              key_gap=args.key_gap, compare=args.compare_maps, guard=args.guard,
                              guard_period=args.guard_period, skip_tokens=args.skip_tokens,
                              band_layers=args.band_layers, band_window=args.band_window,
                              band_full_layers=args.band_full_layers, threads=args.threads, seed=args.seed)
    result = evaluate.run(cfg)
    print(evaluate.report(result))
    _write(evaluate, result, args)


def cmd_sweep(args: argparse.Namespace) -> None:
    from . import sweep
    from .modelfile import check_gguf
    check_gguf(args.model)
    cfg = sweep.SweepConfig(model=args.model, split_layers=args.split_layers, tails=args.tail_tokens,
                            length=args.length, sink_tokens=args.sink_tokens, calib_tokens=args.calib_tokens,
                            corpus=args.corpus, prompts=args.prompts, domains=args.domains, repeats=args.repeats,
                            needle=args.needle, needle_trials=args.needle_trials, threads=args.threads,
                            workdir=args.workdir)
    print(sweep.HEADER)
    result = sweep.run(cfg)
    print()
    print(sweep.report(result))
    _write(sweep, result, args)


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run
    run(model=args.model, n_prompt=args.prompt_tokens, threads=args.threads, split_layer=args.split_layer,
        calib_tokens=args.calib_tokens, tail_tokens=args.tail_tokens, workdir=args.workdir)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ridgefill", description="RidgeFill: approximate prefill for llama.cpp")
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("fetch-models", help="download and verify the small real models")
    s.add_argument("names", nargs="*", help="models to fetch (default: all)")
    s.set_defaults(func=cmd_fetch_models)

    s = sub.add_parser("calibrate", help="fit ridge maps for a split layer from one pass over text")
    s.add_argument("model", help="base model GGUF")
    s.add_argument("-s", "--split-layer", type=int, required=True, help="layers below it run exactly")
    s.add_argument("--text", action="append", type=Path, metavar="FILE", help="calibration text file (repeatable)")
    s.add_argument("--corpus", help="calibration corpus from ridgefill.data instead of --text (default: brown)")
    s.add_argument("-o", "--output", required=True, type=Path, help="map file to write (GGUF)")
    s.add_argument("-n", "--tokens", type=int, default=65536, help="token budget (default 65536)")
    s.add_argument("-c", "--ctx", type=int, default=1024, help="chunk length in tokens (default 1024)")
    s.add_argument("--read-order", choices=["sequential", "spread"], default="sequential",
                   help="which documents (corpus) or files (--text) the budget reads: from the first on (default), "
                        "or spread over all of them")
    s.add_argument("--lambda", dest="ridge_lambda", type=_lambda, default="auto",
                   help="ridge λ relative to trace(HᵀH)/d, or 'auto' (held-out grid search; default)")
    s.add_argument("--map-kind", choices=["input", "kv"], default="input",
                   help="what the maps predict: each late layer's input (default), or its K and V")
    s.add_argument("--context-tokens", type=int, default=0, metavar="C",
                   help="features: the split layer's states of the token and of its C predecessors (0..2; "
                        "default 0; needs --sink-tokens >= C)")
    s.add_argument("--prior", choices=["zero", "identity"], default=None,
                   help="shrink W toward 0 or I (default: identity for input maps, zero for kv)")
    s.add_argument("--val-fraction", type=float, default=0.1, help="fraction of chunks held out (default 0.1)")
    s.add_argument("--map-type", choices=["f32", "f16", "q8_0"], default="f32", help="storage type of W")
    s.add_argument("--sink-tokens", type=int, default=4, help="first positions of each chunk left out (default 4)")
    s.add_argument("--band-layers", type=int, default=0, metavar="B",
                   help="record a windowed band as the runtime's default: on filled rows the B layers below the split "
                        "run in full, attending to the sink and --band-window latest positions (default 0: none; "
                        "on SmolLM2 we recommend -s 24 --band-layers 24 for long prompts, with flash attention on at "
                        "run time: docs/maps.md); with --ctx longer than the window the maps are fitted on what the "
                        "band passes them (a second, windowed pass per chunk)")
    s.add_argument("--band-window", type=int, default=1024, metavar="W",
                   help="latest positions a band layer of a filled row attends to (default 1024: at 8K prompts it "
                        "keeps the KL within 1.11x of the split alone; docs/maps.md)")
    s.add_argument("--band-full-layers", type=_full_layers, default=[], metavar="L1,L2,..|auto[:N]",
                   help="band layers that attend to every position, as exact layers do (default: none): the far "
                        "context the window takes from them is what the maps miss most; 'auto[:N]' chooses N of "
                        "them (default two fifths of the band) by the tail KL on the calibration text, after "
                        "fitting (about 12 prefills of 8K per calibration prompt for a band of 10, up to 4 prompts; "
                        "docs/maps.md)")
    s.add_argument("--diag-tokens", type=int, default=1024, help="held-out tokens sampled for K/V diagnostics")
    s.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_calibrate)

    s = sub.add_parser("export", help="write an augmented GGUF: the model plus its maps")
    s.add_argument("model", help="base model GGUF")
    s.add_argument("maps", help="map file from `ridgefill calibrate`")
    s.add_argument("-o", "--output", required=True, type=Path, help="augmented GGUF to write")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("info", help="print the RidgeFill metadata and diagnostics of a map file or augmented model")
    s.add_argument("file")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("bench", help="time to first token, exact vs RidgeFill, interleaved in one process")
    s.add_argument("model", nargs="?", help="augmented GGUF (or the base model with --maps); with --server only "
                   "for the FLOP limit, if the server's model file is elsewhere")
    s.add_argument("--maps", help="map file (default: the maps in MODEL)")
    s.add_argument("--server", metavar="URL", help="measure through a running ridgefill-server instead")
    s.add_argument("--chat", type=int, metavar="N", help="with --server: an N-turn conversation through the prompt "
                   "cache instead of single prompts (TTFT per turn)")
    s.add_argument("--turn-tokens", type=int, default=1024, metavar="K",
                   help="with --chat: new prose tokens each turn (default 1024)")
    s.add_argument("--lengths", type=_ints, default=[1024, 2048, 4096], help="prompt lengths (default 1024,2048,4096)")
    s.add_argument("--tail-tokens", type=int, default=None, help="exact tail (default 1024; with --server the server's)")
    s.add_argument("--sink-tokens", type=int, default=4, help="exact first tokens (default 4)")
    s.add_argument("-r", "--repeats", type=int, default=3,
                   help="interleaved repeats per length, or conversations per mode with --chat (default 3)")
    s.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    s.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, metavar="N",
                   help="in-process: layers to offload to the GPU (or RPC) device, as llama.cpp's -ngl (default 0)")
    s.add_argument("-fa", "--flash-attn", choices=["on", "off"], default="off",
                   help="in-process: flash attention (default off, as llama-cpp-python)")
    _band_override_args(s)
    s.add_argument("--compare-maps", type=_names, default=[], metavar="A,B",
                   help="in-process: other map files of the same model, timed beside --maps: exact and every file "
                        "rotated on one context, each with the band its file records")
    s.add_argument("--guard-cost", action="store_true",
                   help="in-process: exact, RidgeFill without and with the out-of-distribution guard, rotated")
    s.add_argument("--domain", default="brown", help="with --guard-cost: the corpus of the prompts (default brown)")
    s.add_argument("--guard-period", type=int, default=None, metavar="N",
                   help="with --guard-cost: positions between the guard's checks after the probe (default 1024)")
    s.add_argument("--json", help="write the results as JSON")
    s.add_argument("--plot", help="write TTFT and speedup against length, or per turn with --chat (PNG)")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("eval", help="quality, exact vs RidgeFill on the same prompts: kl, longdep, needle, splice")
    s.add_argument("model", help="augmented GGUF (or the base model with --maps)")
    s.add_argument("--maps", help="map file (default: the maps in MODEL)")
    s.add_argument("--compare-maps", type=_names, default=[], metavar="A,B",
                   help="other map files of the model, each evaluated as one more mode (maps:NAME) on the same prompts")
    s.add_argument("--guard", action="store_true",
                   help="also evaluate RidgeFill with the out-of-distribution guard (mode guard; mode ridgefill "
                        "runs without it), and report how often it falls back")
    s.add_argument("--guard-period", type=int, default=None, metavar="N",
                   help="with --guard or --task guard: positions between the guard's checks after the probe "
                        "(0: the probe only; default: the runtime's, 1024)")
    _band_override_args(s)
    s.add_argument("--task", action="append", required=True, metavar="TASK",
                   help="kl, longdep, needle, splice or guard (the guard's verdicts only) (repeatable or "
                        "comma-separated)")
    s.add_argument("--lengths", type=_ints, default=[2048], help="prompt lengths (default 2048)")
    s.add_argument("--tail-tokens", type=int, default=256, help="exact tail (default 256)")
    s.add_argument("--sink-tokens", type=int, default=4, help="exact first tokens (default 4)")
    s.add_argument("--prompts", type=int, default=4,
                   help="prompts per length and domain for kl/longdep/splice/guard (default 4)")
    s.add_argument("--skip-tokens", type=int, default=0, metavar="N",
                   help="start the prompts N tokens into each text, e.g. for a second sample disjoint from a first "
                        "(default 0; the documents the maps were calibrated on are always skipped)")
    s.add_argument("--domains", type=_names, default=["brown", "shakespeare"],
                   help="corpora to draw prompts from (default brown,shakespeare; also python-code, spanish, "
                        "french-tech, portuguese-tech, email)")
    s.add_argument("--text", action="append", metavar="FILE", help="evaluate on your own text too (repeatable; "
                   "alone it replaces the default domains)")
    s.add_argument("--depths", type=_floats, default=[0.1, 0.3, 0.5, 0.7, 0.9],
                   help="needle depths as fractions of the filled region (default 0.1,0.3,0.5,0.7,0.9)")
    s.add_argument("--needle-trials", type=int, default=4, help="pass keys per length and depth (default 4)")
    s.add_argument("--key-gap", type=float, default=1.0,
                   help="longdep: key tokens gain more than this many nats from the distant context (default 1)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    s.add_argument("--json", help="write the results as JSON")
    s.add_argument("--plot", help="write needle heatmaps and KL bars (PNG)")
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("sweep", help="split layers × tail lengths: speedup against quality, the frontier")
    s.add_argument("model", help="base model GGUF (maps are calibrated per split layer into --workdir)")
    s.add_argument("--split-layers", type=_ints, required=True, help="e.g. 15,20")
    s.add_argument("--tail-tokens", type=_ints, default=[256, 1024], help="tails (default 256,1024)")
    s.add_argument("--length", type=int, default=4096, help="prompt length (default 4096)")
    s.add_argument("--sink-tokens", type=int, default=4, help="exact first tokens (default 4)")
    s.add_argument("--calib-tokens", type=int, default=8192, help="calibration budget per split layer (default 8192)")
    s.add_argument("--corpus", default="brown", help="calibration corpus (default brown)")
    s.add_argument("--prompts", type=int, default=2, help="prompts per domain for the quality (default 2)")
    s.add_argument("--domains", type=_names, default=["shakespeare"],
                   help="corpora for the quality prompts (default shakespeare)")
    s.add_argument("-r", "--repeats", type=int, default=1, help="interleaved timing repeats (default 1)")
    s.add_argument("--needle", action="store_true", help="also measure needle accuracy (slow)")
    s.add_argument("--needle-trials", type=int, default=2, help="pass keys per depth (default 2)")
    s.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    s.add_argument("--workdir", default="out/sweep", help="where the maps go (default out/sweep)")
    s.add_argument("--json", help="write the results as JSON")
    s.add_argument("--plot", help="write speedup against KL with the frontier (PNG)")
    s.set_defaults(func=cmd_sweep)

    s = sub.add_parser("demo", help="calibrate, export, then exact vs RidgeFill prefill of a long prompt (bindings and server)")
    s.add_argument("-m", "--model", help="GGUF model (default: SmolLM2-135M, fetched)")
    s.add_argument("-p", "--prompt-tokens", type=int, default=4096, help="prompt length in tokens (default 4096)")
    s.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    s.add_argument("-s", "--split-layer", type=int, default=20, help="split layer of the maps (default 20)")
    s.add_argument("--calib-tokens", type=int, default=8192, help="calibration budget (default 8192)")
    s.add_argument("--tail-tokens", type=int, default=1024, help="exact tail of the prompt (default 1024)")
    s.add_argument("--workdir", default="out", help="where maps and the augmented model go (default out/)")
    s.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is cmd_eval:
        args.domains_given = any(a == "--domains" or a.startswith("--domains=") for a in (argv or sys.argv[1:]))
    if not getattr(args, "func", None):
        parser.print_help()
        raise SystemExit(2)
    try:
        args.func(args)
    except RidgefillError as e:
        print(f"ridgefill: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
