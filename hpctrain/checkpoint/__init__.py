"""Checkpoints: sharded zarr v3 arrays written by tensorstore, async, atomically committed, checksummed.

    ck = Checkpointer("ckpts", rank=rank, world_size=world, retention=Retention(keep_last=3))
    state = {"model": {"w": Shard(w_local, global_shape=(8192, 4096), offset=(tp_rank * 2048, 0),
                                  write=dp_rank == 0),          # a tensor-parallel slice
                       "norm": norm},                           # replicated: rank 0 writes it
             "optim": opt.state_dict(), "epoch": 3}
    restored = ck.load_latest(like=state)   # fills state's tensors in place; None on a fresh start
    if restored:
        restore_rng_state(restored.rng); loader.seek(restored.cursor)
    ck.save(step, state, cursor=loader.cursor(), metrics={"val_loss": v}, async_=True, copy="background")
    loss = forward_backward(batch)           # runs while the state is copied to host memory
    ck.wait_snapshot(); opt.step()           # the copy must be done before the state changes
    ck.close()                               # waits for the last save; raises its error

Layout of a checkpoint: ``step_<N>/manifest.json`` (written last), ``rank-<r>.json`` and one zarr
array per tensor under ``tensors/<path>``. Names are imported on first use: ``hpctrain ckpt``
imports this package and must not load numpy, tensorstore or torch until a command needs them.
"""

from __future__ import annotations

from hpctrain.lazy import lazy_exports

_EXPORTS = {
    "Checkpointer": "checkpointer",
    "Shard": "tree",
    "Retention": "retention",
    "Restored": "resume",
    "latest_valid": "resume",
    "load_latest": "resume",
    "statuses": "resume",
    "load": "reader",
    "load_flat": "reader",
    "load_values": "reader",
    "verify": "reader",
    "capture_rng_state": "rng",
    "restore_rng_state": "rng",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
