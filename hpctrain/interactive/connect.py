"""The login side of an interactive session: its address and token as the compute node wrote them, waiting until
JupyterLab answers, the SSH tunnel line, the page that opens the lab in a browser, and how long the session has been
idle (Jupyter's own count). The token stays in files readable by the user alone: never on a command line, which
every user of the host can read, nor in what `hpctrain status` prints."""

from __future__ import annotations

import html
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.contract import JobPaths
from hpctrain.errors import HpctrainError
from hpctrain.files import write_atomic
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.states import TERMINAL

ANSWER_TIMEOUT_S = 2.0


class SessionFailed(HpctrainError):
    """The session's server could not start; the message says why and what to change."""


@dataclass(frozen=True)
class Session:
    """A running session: JupyterLab's server (where it listens on its node, its token), or an allocation held for
    shells (``shell``: no server); ``file``: the session file it was read from, readable by the user alone."""

    node: str
    address: str
    port: int
    token: str
    idle_minutes: float
    shell: bool = False
    file: Path | None = None

    @classmethod
    def read(cls, job_dir: Path | str) -> Session | None:
        """The session of a job directory; None until its server has written it. Raises SessionFailed with the
        server's reason when it could not start."""
        file = JobPaths(Path(job_dir)).session_file
        try:
            found = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if "error" in found:
            raise SessionFailed(found["error"])
        if found.get("shell"):
            return cls(found["node"], "", 0, "", float(found["idle_minutes"]), shell=True, file=file)
        return cls(
            found["node"], found["address"], int(found["port"]), found["token"], float(found["idle_minutes"]), file=file
        )

    def ready(self) -> bool:
        """Whether the user can start working: the server answers (a shell session is ready once held)."""
        return self.shell or self.idle_s() is not None

    def shell_command(self, slurm_job_id: str, shell: str) -> list[str]:
        """The command that starts a shell in the session's allocation, beside what runs there."""
        return ["srun", "--jobid", slurm_job_id, "--overlap", "--pty", "--", shell, "-l"]

    def url(self, host: str | None = None, token: bool = True) -> str:
        """The lab's URL, with its token unless ``token`` is False (the lab then asks for it): on the node, or
        through a tunnel at ``host`` ('localhost')."""
        return f"http://{host or self.address}:{self.port}/lab" + (f"?token={self.token}" if token else "")

    def browser_page(self) -> Path:
        """A page beside the session file, readable by the user alone, that sends a browser on to the lab with its
        token (as Jupyter's own browser opening does): a browser opened on it has the page's path on its command
        line, not the token."""
        if self.file is None:
            raise HpctrainError("this session was not read from its session file: it has no page to open")
        page, url = self.file.with_name("session.html"), html.escape(self.url(), quote=True)
        write_atomic(
            page,
            f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={url}">'
            f'<title>hpctrain notebook</title></head><body><a href="{url}">JupyterLab</a></body></html>\n',
            mode=0o600,
        )
        return page

    def tunnel(self, login_host: str, user: str) -> str:
        """The command that forwards this machine's port to the node's server, through the login node."""
        return f"ssh -N -L {self.port}:{self.address}:{self.port} {user}@{login_host}"

    def api(self, path: str) -> Any:
        """GET a Jupyter server API path (token in a header, never in a log); raises OSError when it does not
        answer."""
        request = urllib.request.Request(
            f"http://{self.address}:{self.port}/api/{path}", headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S) as response:
            return json.load(response)

    def idle_s(self) -> float | None:
        """Seconds since the server's last activity (kernels, API calls), as Jupyter counts them; None when it
        does not answer. The status call itself is not counted as activity."""
        from datetime import datetime

        try:
            status = self.api("status")
        except (OSError, ValueError):
            return None
        last = datetime.fromisoformat(status["last_activity"].replace("Z", "+00:00"))
        return max(time.time() - last.timestamp(), 0.0)


def wait_ready(ledger: Ledger, client: SlurmClient, site: str, job_id: int, timeout_s: float) -> Session:
    """Wait until job ``job_id``'s session is ready (its server answers); the session. Raises SessionFailed when the server could not
    start, HpctrainError when the job ended first or ``timeout_s`` passed (the caller cancels the job)."""
    from hpctrain.jobs.poll import Poller

    poller, job = Poller(ledger, client, site), ledger.jobs.known(job_id)
    if job["job_dir"] is None:
        raise HpctrainError(f"job {job_id} was never submitted ({job['state']})")
    job_dir, end, polled = job["job_dir"], time.monotonic() + timeout_s, 0.0
    while True:
        session = Session.read(job_dir)
        if session is not None and session.ready():
            return session
        if time.monotonic() - polled > 3:
            poller.refresh()
            polled = time.monotonic()
            state = ledger.jobs.known(job_id)["state"]
            if state in TERMINAL:
                Session.read(job_dir)  # the server's reason, when it wrote one
                raise HpctrainError(
                    f"the session's job {job['slurm_job_id']} ended {state} before JupyterLab answered: "
                    f"see `hpctrain logs {job_id}`"
                )
        if time.monotonic() > end:
            raise HpctrainError(
                f"JupyterLab did not answer within {timeout_s:.0f} s (job {job['slurm_job_id']}, "
                f"state {ledger.jobs.known(job_id)['state']}): try again with a longer --timeout"
            )
        time.sleep(0.5)


def running_sessions(ledger: Ledger, job_ids: list[int]) -> dict[int, dict[str, Any]]:
    """The sessions among running jobs ``job_ids`` as `status` shows them: the URL on the node without its token and
    the file that holds it (readable by the user alone), idle seconds as Jupyter counts them, the idle limit (none
    for a server that has not written its address yet)."""
    out = {}
    for job_id, job_dir in ledger.jobs.session_dirs(job_ids).items():
        try:
            session = Session.read(job_dir)
        except SessionFailed:
            continue
        if session is not None and not session.shell:
            out[job_id] = {
                "url": session.url(token=False),
                "token_file": str(session.file),
                "idle_s": session.idle_s(),
                "idle_minutes": session.idle_minutes,
            }
    return out
