"""The `ridgefill` command.

    ridgefill --version                 fork identity: our version, upstream pin, patch series
    ridgefill fetch-models [NAME ...]   download and verify the small test models
    ridgefill demo [-m MODEL]           the main job on the small model (see README)
"""
from __future__ import annotations

import argparse
import sys

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


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run
    run(model=args.model, n_prompt=args.prompt_tokens, threads=args.threads)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ridgefill", description="RidgeFill: approximate prefill for llama.cpp")
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("fetch-models", help="download and verify the small real models")
    s.add_argument("names", nargs="*", help="models to fetch (default: all)")
    s.set_defaults(func=cmd_fetch_models)

    s = sub.add_parser("demo", help="run a long prompt through the bindings and the server, print TTFT")
    s.add_argument("-m", "--model", help="GGUF model (default: SmolLM2-135M, fetched)")
    s.add_argument("-p", "--prompt-tokens", type=int, default=4096, help="prompt length in tokens (default 4096)")
    s.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    s.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
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
