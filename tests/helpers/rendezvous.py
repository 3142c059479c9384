"""Where test ranks meet: a TCPStore the test's own process holds on a port the OS gave it, as torchrun's agent does
(``TORCHELASTIC_USE_AGENT_STORE``: every rank is a client). A port found free and then handed to ranks can be taken
meanwhile by another process on a busy machine (once, beside the whole suite and two CPU hogs, a rank waited 300 s
on a store that failed it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import TCPStore


def agent_store() -> tuple[TCPStore, dict[str, str]]:
    """The store (keep it referenced while the ranks run) and the environment that sends ranks to it."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return store, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
