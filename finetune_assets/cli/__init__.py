"""``finetune-assets``: what users do outside the UI: register dataset versions, see their status,
and classify text with a trained model.

One module per command group; each adds its sub-commands with ``register``. Imports are lazy (only
the standard library at module level) so ``--help`` and ``predict`` on a local folder do not pay for
Dagster or MLflow.
"""

from __future__ import annotations

import argparse
import sys

from finetune_assets.cli import benchmarks, predict, summary, versions
from finetune_assets.cli.common import ROOT_ENV, CliError

GROUPS = (versions, predict, benchmarks, summary)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="finetune-assets",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", help=f"storage root (default ${ROOT_ENV} or ./.finetune_assets)")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(sub)
    return parser


# values that may start with "-" ("-1=Negative,1=Positive")
VALUE_FLAGS = (
    "--label-mapping",
    "--labels",
)


def _join_dash_values(argv: list[str]) -> list[str]:
    """``--label-mapping -1=Negative`` as ``--label-mapping=-1=Negative``: argparse reads a value
    that starts with ``-`` and is not a plain negative number as an option (and says "expected one
    argument").
    """
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg in VALUE_FLAGS:
            value = next(it, None)
            if value is not None and value.startswith("-") and not value.startswith("--"):
                out.append(f"{arg}={value}")
                continue
            out.append(arg)
            if value is not None:
                out.append(value)
            continue
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(_join_dash_values(argv))
    try:
        return args.func(args)
    except (
        CliError,
        ValueError,
        OSError,
    ) as err:  # input or environment mistakes: one line, no traceback
        if isinstance(err, BrokenPipeError):  # `... | head`
            return 0
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
