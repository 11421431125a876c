"""``python -m finetune_assets.core.training --config <path or fsspec URL>``: what torchrun runs in
every worker.
"""

from __future__ import annotations

import argparse
import logging
import sys

from torch.distributed.elastic.multiprocessing.errors import record

from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.run import train


@record  # writes the exception to torchrun's error file, so launchers can show it
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m finetune_assets.core.training", description=__doc__
    )
    parser.add_argument(
        "--config", required=True, help="trainer config JSON: local path or fsspec URL"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    train(TrainerConfig.from_json(args.config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
