"""What the framework examples share to let a person (or a test) watch a preemption: the same command line
(``DIR [--steps N] [--step-s S] [--progress FILE]``) and one line per step in FILE."""

from __future__ import annotations

import argparse
from pathlib import Path


def arguments(doc: str, directory: str) -> argparse.ArgumentParser:
    """The examples' common options; add your own, then ``parse_args()``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(directory, type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-s", type=float, default=0.0, help="sleep after each step")
    parser.add_argument("--progress", type=Path, help="append each step's number to this file")
    return parser


def record(progress: Path | None, step: int) -> None:
    if progress is not None:
        with progress.open("a") as f:
            f.write(f"{step}\n")
