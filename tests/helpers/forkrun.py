"""Ranks on this machine started as torchrun --standalone starts them, but forked from one process that has already
imported what every rank imports (torch, DeepSpeed, hpctrain's trainer): `python -m helpers.forkrun NPROC -m MODULE
ARG...`. A rank's start is almost all imports (about 5 CPU-seconds, the training steps of these tests a fraction of
one). The imported objects are frozen out of the garbage collector and a rank ends without tearing its modules down:
either would touch every inherited object and so copy the parent's pages into each rank. A 4-rank run of one step
costs 3.6 CPU-seconds (torchrun: 17). Each rank gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE: the launcher holds the ranks'
store, as torchrun's agent does, started once the ranks are forked so that none inherits its thread) and runs MODULE
as ``__main__`` with ARG...; as under torchrun, the first rank to fail ends the others (SIGKILL) and the run's exit
status is not 0. Tests of torchrun's own launch path use torchrun (helpers.train.torchrun with ``fork=False``)."""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import runpy
import signal
import sys
import threading
import traceback
import uuid

PR_SET_PDEATHSIG = 1


def rank_main(rank: int, nproc: int, port_pipe: int, run_id: str, module: str, args: list[str]) -> int:
    """In the forked child: torchrun's environment for ``rank`` (the store's port read from ``port_pipe``), then
    MODULE as __main__; its exit status."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a launcher killed (a test's timeout) takes its ranks
    with os.fdopen(port_pipe) as pipe:
        port = pipe.read()
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank),
                      WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), ROLE_WORLD_SIZE=str(nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCHELASTIC_USE_AGENT_STORE="True",
                      TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0")
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str]) -> int:
    nproc, flag, module, *args = argv
    assert flag == "-m", "usage: python -m helpers.forkrun NPROC -m MODULE [ARG...]"
    # What `python -m hpctrain.train` imports: torch, DeepSpeed, tensorstore, webdataset, the trainer's packages
    import hpctrain.runtime.requeue  # noqa: F401
    import hpctrain.slurm  # noqa: F401
    import hpctrain.train.checkpointing  # noqa: F401
    import hpctrain.train.dataset  # noqa: F401
    import hpctrain.train.engine  # noqa: F401
    import hpctrain.train.evaluation  # noqa: F401
    import hpctrain.train.sample  # noqa: F401
    import hpctrain.train.state  # noqa: F401

    gc.freeze()  # the imported objects stay out of the ranks' collections, which would copy their pages (copy-on-write)
    run_id, ranks, port_pipes = uuid.uuid4().hex, {}, []
    for rank in range(int(nproc)):
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            for end in (write_end, *port_pipes):
                os.close(end)
            code = rank_main(rank, int(nproc), read_end, run_id, module, args)
            threading._shutdown()  # type: ignore[attr-defined]  # a process's exit, as multiprocessing's children
            atexit._run_exitfuncs()  # end theirs: non-daemon threads joined, atexit handlers run, streams
            sys.stdout.flush()  # flushed; then no module teardown (it would copy every inherited page)
            sys.stderr.flush()
            os._exit(code)
        os.close(read_end)
        ranks[pid] = rank
        port_pipes.append(write_end)
    from helpers.rendezvous import agent_store

    store, meet = agent_store()  # noqa: F841  (held while the ranks run)
    for end in port_pipes:
        os.write(end, meet["MASTER_PORT"].encode())
        os.close(end)
    failed = 0
    while ranks:
        pid, status = os.wait()
        rank, code = ranks.pop(pid), os.waitstatus_to_exitcode(status)
        if code != 0 and not failed:
            failed = code
            print(f"helpers.forkrun: rank {rank} failed (exitcode: {code}) local_rank: {rank}", file=sys.stderr)
            for other in ranks:  # the run failed: its peers would wait in a collective (the trainer takes SIGTERM
                os.kill(other, signal.SIGKILL)  # for a preemption notice and would try to save)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
