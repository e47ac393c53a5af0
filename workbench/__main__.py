"""Command line: ``python -m workbench {run,demo,reproduce}``.

- ``run EXPERIMENT.yaml [--set key=value ...]``: train one experiment (resumes a matching unfinished run).
- ``demo``: the main job — the quickstart notebook on the embedded default (HACPO vs GSPO), then a table.
- ``reproduce [--smoke] [--only NAME ...]``: re-execute every benchmark/ablation notebook with papermill.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (2-core machines)

log = logging.getLogger("workbench")


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.basicConfig(level=logging.INFO if not verbose else logging.DEBUG, handlers=[handler])
    for noisy in ("httpx", "urllib3", "papermill", "filelock", "transformers", "traitlets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _cmd_run(args: argparse.Namespace) -> int:
    from workbench.train.run import train

    run_dir = train(args.experiment, overrides=args.set, resume=not args.fresh)
    log.info("run directory: %s", run_dir)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from workbench.lab.runner import run_quickstart

    start = time.perf_counter()
    log.info("executing notebooks/01_quickstart.ipynb (HACPO and GSPO; builds the tiny agents on first use)")
    outputs = run_quickstart(smoke=args.smoke, progress=True)
    table = outputs["table"]
    log.info(
        "\nHeld-out greedy accuracy per agent: before training, after each method, and the difference:\n%s",
        table.round(3).to_string(),
    )
    log.info("\nwrote:")
    for path in outputs["files"]:
        log.info("  %s", path)
    log.info("wall time: %.0f s", time.perf_counter() - start)
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from workbench.lab.runner import reproduce

    index = reproduce(smoke=args.smoke, only=args.only or None, progress=True)
    log.info("index: %s", index)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m workbench`` and the ``hacpo-workbench`` script."""
    parser = argparse.ArgumentParser(prog="python -m workbench", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train one experiment YAML")
    run.add_argument("experiment", help="path of an experiment YAML, e.g. experiments/quickstart.yaml")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, repeatable")
    run.add_argument("--fresh", action="store_true", help="start a new run even if a matching one exists")
    run.set_defaults(func=_cmd_run)
    demo = sub.add_parser("demo", help="the main job: quickstart notebook, HACPO vs GSPO on tiny agents")
    demo.add_argument("--smoke", action="store_true", help="a few steps only (seconds, for CI)")
    demo.set_defaults(func=_cmd_demo)
    rep = sub.add_parser("reproduce", help="re-execute every benchmark and ablation notebook with papermill")
    rep.add_argument("--smoke", action="store_true", help="shrink every experiment to seconds")
    rep.add_argument("--only", action="append", metavar="NAME", help="only these notebooks/experiments")
    rep.set_defaults(func=_cmd_reproduce)
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    from workbench.config.experiment import ConfigError
    from workbench.core.lock import RunLockedError
    from workbench.core.storage import StorageError

    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, StorageError, RunLockedError) as exc:
        # Named failures a person can fix (the message says how): one line, no traceback.
        log.error("error: %s", exc)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: train() has logged how to resume
        return 130


if __name__ == "__main__":
    sys.exit(main())
