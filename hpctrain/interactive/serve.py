"""The compute-node side of an interactive session: JupyterLab, ended by Jupyter's own idle culling.

Kernels idle for the spec's ``idle_minutes`` are culled (connected or not, never a busy one), and the server stops
once none is left and nothing happened for as long (Jupyter's ``shutdown_no_activity``, asked every CHECK_S seconds
instead of its own once a minute): the allocation ends and its GPUs are free. GPUs that NVML reads idle for as long
end the session too, whatever its kernels do (the node's sampler, hpctrain.runtime.utilization). The server listens
on the node's address with a fresh token; both go to the job directory's session file, readable by the user alone
(never into Slurm, the script or the ledger). A stop notice (preemption, the time limit) is shown in every kernel:
kernels run with the `hpctrain.interactive.notice` extension, and the server passes the notice on to each of them.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from hpctrain.config.job import Interactive
from hpctrain.contract import JobEnvironment, JobPaths
from hpctrain.files import write_json_atomic

CHECK_S = 10  # how often idle kernels are culled and the server asks whether it is idle
NOTICE_SIGNAL = signal.SIGUSR2  # the batch script passes every stop signal on to the job step as this


class SessionError(Exception):
    """The server cannot start: one line saying what to change."""


def node_address() -> str:
    """The address other hosts reach this node at (its host name's)."""
    return socket.gethostbyname(socket.gethostname())


def free_port(address: str, port: int) -> int:
    """``port`` if free on ``address``, or any free one for 0."""
    with socket.socket() as probe:
        try:
            probe.bind((address, port))
        except OSError as exc:
            raise SessionError(
                f"port {port} is in use on {socket.gethostname()} ({exc.strerror}): "
                "give another --port, or none for a free one"
            ) from None
        return int(probe.getsockname()[1])


def kernel_spec_dir(root: Path) -> Path:
    """A Jupyter data directory whose python3 kernel loads the notice extension (first on JUPYTER_PATH, it
    stands in for ipykernel's own; the user's IPython profile is untouched)."""
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    argv.append("--IPKernelApp.extra_extensions=hpctrain.interactive.notice")
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3 (ipykernel)", "language": "python"}), encoding="utf-8"
    )
    return root


def server_args(session: Interactive, address: str, port: int, token: str) -> list[str]:
    """JupyterLab's settings for a session (given in-process: the token never shows in a process list)."""
    idle_s = max(int(session.idle_minutes * 60), 1)
    return [
        f"--ServerApp.ip={address}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.open_browser=False",
        f"--ServerApp.allow_root={os.geteuid() == 0}",
        f"--ServerApp.root_dir={Path.cwd()}",
        "--ServerApp.default_url=/lab",
        f"--ServerApp.shutdown_no_activity_timeout={idle_s}",
        f"--IdentityProvider.token={token}",
        f"--MappingKernelManager.cull_idle_timeout={idle_s}",
        f"--MappingKernelManager.cull_interval={CHECK_S}",
        "--MappingKernelManager.cull_connected=True",
        "--MappingKernelManager.cull_busy=False",
    ]


def pass_notice(app: Any) -> None:
    """Send the stop notice on to every kernel's process (not its process group: a kernel's own children keep
    their default reaction)."""
    print(f"hpctrain notebook: stop notice at {time.strftime('%H:%M:%S')}; passed on to the kernels", file=sys.stderr)
    for kernel_id in list(app.kernel_manager.list_kernel_ids()):
        process = getattr(app.kernel_manager.get_kernel(kernel_id).provisioner, "process", None)
        if process is not None:
            try:
                os.kill(process.pid, NOTICE_SIGNAL)
            except ProcessLookupError:
                pass


def serve(env: JobEnvironment, session: Interactive) -> int:
    """Run the server until Jupyter finds it idle or a signal stops it."""
    paths = JobPaths(env.job_dir or Path.cwd())
    try:
        import jupyterlab  # noqa: F401  # the lab's pages, not only the server
        from jupyter_server.serverapp import ServerApp
        from tornado import ioloop
    except ImportError as exc:
        raise SessionError(
            f"JupyterLab is not installed for {sys.executable} ({exc.name} is missing): "
            "pip install 'hpctrain[notebook]' there, or use an image that has it"
        ) from None
    address = node_address()
    port = free_port(address, session.port)
    token = secrets.token_urlsafe(32)
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [str(kernel_spec_dir(paths.job_dir / "jupyter")), *filter(None, [os.environ.get("JUPYTER_PATH")])]
    )
    app = ServerApp.instance()
    app.initialize(server_args(session, address, port, token))
    loop = ioloop.IOLoop.current()
    signal.signal(NOTICE_SIGNAL, lambda *_: loop.add_callback_from_signal(pass_notice, app))
    ioloop.PeriodicCallback(app.shutdown_no_activity, CHECK_S * 1000).start()
    node = env.node or socket.gethostname()
    write_json_atomic(
        paths.session_file,
        {"node": node, "address": address, "port": port, "token": token, "idle_minutes": session.idle_minutes},
        mode=0o600,
    )
    print(f"hpctrain notebook: JupyterLab on {node} at http://{address}:{port}/lab", file=sys.stderr, flush=True)
    app.start()
    return 0


def hold(env: JobEnvironment, session: Interactive) -> int:
    """A shell session: hold the allocation while shells run in it (job steps other than this one and the batch
    script's), and end once none has run for the idle time, or at a stop signal."""
    from hpctrain.errors import SlurmError
    from hpctrain.slurm.client import SlurmClient

    paths, node, client = JobPaths(env.job_dir or Path.cwd()), env.node or socket.gethostname(), SlurmClient()
    job, own = env.slurm_job_id or "", env.slurm_step
    write_json_atomic(
        paths.session_file, {"node": node, "shell": True, "idle_minutes": session.idle_minutes}, mode=0o600
    )
    print(f"hpctrain notebook: holding the allocation on {node} for shells", file=sys.stderr, flush=True)
    stopped, last = False, time.monotonic()

    def stop(*_: Any) -> None:
        nonlocal stopped
        stopped = True

    def notice(*_: Any) -> None:
        print(f"hpctrain notebook: stop notice at {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)

    before = {sig: signal.signal(sig, handler) for sig, handler in ((signal.SIGTERM, stop), (NOTICE_SIGNAL, notice))}
    try:
        while not stopped and time.monotonic() - last < session.idle_minutes * 60:
            time.sleep(CHECK_S)
            try:
                steps = client.steps(job)
            except SlurmError:  # the controller busy or restarting: not known to be idle
                steps = ["?"]
            if any(step not in (own, f"{job}.batch", f"{job}.extern") for step in steps):
                last = time.monotonic()
    finally:  # callers that go on (tests, an embedding program) keep their own handlers
        for sig, handler in before.items():
            signal.signal(sig, handler)
    return 0


def main() -> int:
    env = JobEnvironment()
    from hpctrain.config import load_job_spec

    spec = load_job_spec(env.spec_file) if env.spec_file else None
    session = spec.interactive if spec and spec.interactive else Interactive()
    if session.shell:
        return hold(env, session)
    try:
        return serve(env, session)
    except SessionError as exc:
        if env.job_dir is not None:
            write_json_atomic(JobPaths(env.job_dir).session_file, {"error": str(exc)}, mode=0o600)
        print(f"hpctrain notebook: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
