"""Per-task shim started by srun: set torch.distributed's variables from Slurm's, then exec the entry point.

    srun python -m hpctrain.launch.task -- python train.py ...
"""

from __future__ import annotations

import os
import sys

from hpctrain.errors import HpctrainError
from hpctrain.launch.rendezvous import task_env


def main(argv: list[str]) -> None:
    command = argv[1:] if argv and argv[0] == "--" else argv
    if not command:
        sys.exit("hpctrain: error: hpctrain.launch.task: no command given")
    try:
        os.environ.update(task_env(os.environ))
        os.execvp(command[0], command)
    except (HpctrainError, OSError) as exc:
        sys.exit(f"hpctrain: error: {command[0]}: {exc}")


if __name__ == "__main__":
    main(sys.argv[1:])
