"""Commands that write, killed at each of their steps: `hpctrain ARGS` run in processes forked from a warm one
(``Forker``; its imports, torch's included, made once: a fresh ``python -m hpctrain model export`` spends seconds
on them), each child killed by SIGKILL to itself right before or right after its Nth step (``Fault``).

The steps, patched in the child only (the product has no test hooks): the commit of each outermost ledger
transaction (``Ledger.transaction``), and each ``os.replace``, ``os.rename``, ``os.mkdir``, ``os.rmdir`` and
``os.unlink`` of a path under the run's ``roots`` (checkpoint directories, export folders). A child that is not
killed logs its steps (``Run.steps``). Several children started at once (``Forker.together``) wait at one barrier
(a pipe, closed once all are forked) before calling the CLI.

``kill_at_every_step`` drives the loop: from the same world each time (``Snapshot``), the command run cleanly
(its steps counted), then killed before (and, separately, after) each of them, each killed run then run again to
completion and checked. The warm process: ``python -m helpers.faults [MODULE...]`` (the modules to
import first), one JSON request a line on stdin, one JSON answer a line on stdout.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.paths import tests_on_path

STEP_CALLS = ("replace", "rename", "mkdir", "rmdir", "unlink")
PR_SET_PDEATHSIG = 1
CHILD_TIMEOUT_S = 120
MAX_STEPS = 50  # more steps than this is a command too big for one test to kill at each


@dataclass(frozen=True)
class Fault:
    """Kill the command right ``when`` ("before" or "after") its ``at``-th step (from 1)."""

    at: int
    when: str


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    steps: list[str]  # "commit", or "<call> <path>", in order; the killed step is the last
    fault: Fault | None

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


class Forker:
    """A warm process that forks each `hpctrain` command of a test (``run``, ``together``). Use it as a context
    manager; ``warm`` names the modules it imports before the first fork."""

    def __init__(self, *warm: str):
        self._warm = warm
        self._folder = Path(tempfile.mkdtemp(prefix="faults-"))
        self._serial = itertools.count()

    def __enter__(self) -> Forker:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "helpers.faults", *self._warm],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=tests_on_path(),
        )
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc.stdin
        self._proc.stdin.close()
        self._proc.wait(timeout=60)
        shutil.rmtree(self._folder, ignore_errors=True)

    def run(self, *args: str, roots: Sequence[Path] = (), fault: Fault | None = None) -> Run:
        """`hpctrain ARGS` in a forked child with this process's environment, ``fault`` injected."""
        return self.together(args, roots=roots, fault=fault)[0]

    def together(self, *commands: Sequence[str], roots: Sequence[Path] = (), fault: Fault | None = None) -> list[Run]:
        """The ``commands`` (each one's args) started at once, each with ``fault``; their runs, in order."""
        runs = []
        for args in commands:
            base = self._folder / str(next(self._serial))
            runs.append(
                {
                    "args": list(args),
                    "env": dict(os.environ),
                    "roots": [str(r) for r in roots],
                    "fault": None if fault is None else [fault.at, fault.when],
                    **{k: f"{base}.{k}" for k in ("stdout", "stderr", "steps")},
                }
            )
        assert self._proc.stdin and self._proc.stdout
        self._proc.stdin.write(json.dumps(runs) + "\n")
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline()
        assert answer, "the warm process ended"
        return [
            Run(
                code,
                Path(r["stdout"]).read_text(),
                Path(r["stderr"]).read_text(),
                Path(r["steps"]).read_text().splitlines(),
                fault,
            )
            for code, r in zip(json.loads(answer), runs)
        ]


class Snapshot:
    """The folder ``world`` as it is now (a ledger, checkpoints, ...), put back by ``restore`` (same paths)."""

    def __init__(self, world: Path):
        self.world, self.copy = world, world.with_name(f"{world.name}.snapshot")
        shutil.copytree(world, self.copy, symlinks=True)

    def restore(self) -> None:
        shutil.rmtree(self.world)
        shutil.copytree(self.copy, self.world, symlinks=True)


def kill_at_every_step(
    forker: Forker,
    args: Sequence[str],
    roots: Sequence[Path],
    world: Snapshot,
    check: Callable[[Run, Run], None],
    killed: Callable[[Run], None] = lambda run: None,
) -> list[str]:
    """`hpctrain ARGS` run cleanly from ``world`` (``check(run, run)``), then for both sides of each of its steps:
    ``world`` restored, the command killed there (``killed(run)``), run again to completion and ``check(killed
    run, rerun)``. The clean run's steps."""
    world.restore()
    clean = forker.run(*args, roots=roots)
    assert clean.returncode == 0 and len(clean.steps) <= MAX_STEPS, (clean.stderr, clean.steps)
    check(clean, clean)
    for when in ("before", "after"):
        for at in range(1, len(clean.steps) + 1):
            world.restore()
            first = forker.run(*args, roots=roots, fault=Fault(at, when))
            calls = [step.split()[0] for step in first.steps]  # their paths may hold the process's id
            assert first.killed and calls == [s.split()[0] for s in clean.steps[:at]], (at, when, first.stderr, calls)
            killed(first)
            again = forker.run(*args, roots=roots)
            assert not again.killed, again.steps
            check(first, again)
    return clean.steps


def _inject(roots: list[str], fault: list[Any] | None, log: int) -> None:
    """Make ``Ledger.transaction``'s commits and the file calls of ``STEP_CALLS`` under ``roots`` steps: each
    logged to the descriptor ``log``, the ``fault``'s one killing this process."""
    from hpctrain.ledger.db import Ledger

    count = itertools.count(1)

    def step(what: str, call: Callable[[], Any]) -> Any:
        n = next(count)
        os.write(log, f"{what}\n".encode())
        if fault == [n, "before"]:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            return call()
        finally:
            if fault == [n, "after"]:
                os.kill(os.getpid(), signal.SIGKILL)

    def inside(path: Any) -> bool:
        try:
            name = os.path.abspath(os.fspath(path))
        except TypeError:  # a descriptor
            return False
        return any(name == r or name.startswith(r + os.sep) for r in roots)

    def patched(name: str) -> Callable[..., Any]:
        real = getattr(os, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            paths = [a for a in args[:2] if isinstance(a, (str, os.PathLike))]
            if kwargs.get("dir_fd") is None and any(inside(p) for p in paths):
                return step(f"{name} {os.fspath(paths[0])}", lambda: real(*args, **kwargs))
            return real(*args, **kwargs)

        return call

    for name in STEP_CALLS:
        setattr(os, name, patched(name))
    real_transaction = Ledger.transaction

    @contextlib.contextmanager
    def transaction(self: Ledger) -> Iterator[Any]:
        outer = not self.db.conn.in_transaction
        manager = real_transaction(self)
        db = manager.__enter__()
        try:
            yield db
        except BaseException:
            if not manager.__exit__(*sys.exc_info()):
                raise
            return
        if outer:
            step("commit", lambda: manager.__exit__(None, None, None))
        else:
            manager.__exit__(None, None, None)

    Ledger.transaction = transaction  # type: ignore[method-assign]


def _child(run: dict[str, Any], barrier: int) -> None:
    """In the forked child: the run's environment, output files and steps, then the CLI at the barrier."""
    code = 1
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.environ.clear()
        os.environ.update(run["env"])
        written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, run["stdout"], written), (2, run["stderr"], written)):
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
        _inject(run["roots"], run["fault"], os.open(run["steps"], written, 0o600))
        signal.alarm(CHILD_TIMEOUT_S)  # a command that hangs ends (SIGALRM) and fails its test, not the whole run
        os.read(barrier, 1)  # end of file once every command of the request is forked
        sys.argv = ["hpctrain", *run["args"]]
        from hpctrain.cli import main

        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(warm: list[str]) -> None:
    """The warm process: each line of stdin, a JSON list of runs, answered with the list of their exit codes."""
    import importlib

    import hpctrain.cli  # noqa: F401

    for module in warm:
        importlib.import_module(module)
    for line in sys.stdin:
        read_end, write_end = os.pipe()
        children = []
        for run in json.loads(line):
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                os.close(write_end)
                _child(run, read_end)
            children.append(pid)
        os.close(write_end)
        os.close(read_end)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
        print(json.dumps(codes), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1:])
