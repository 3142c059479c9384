"""A Jupyter server reached as a browser would: its REST API and a kernel's websocket, with the session's token."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from hpctrain.interactive import Session


def listening(session: Session) -> bool:
    """Whether the server still accepts connections (refused once it has stopped)."""
    try:
        socket.create_connection((session.address, session.port), timeout=10).close()
    except ConnectionRefusedError:
        return False
    except OSError:  # slow to answer: not known to have stopped
        pass
    return True


def api(session: Session, path: str, method: str = "GET", body: dict | None = None) -> Any:
    request = urllib.request.Request(
        f"http://{session.address}:{session.port}/api/{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"token {session.token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def run_cell(session: Session, kernel_id: str, code: str, timeout_s: float = 120, then_s: float = 0,
             until: str | None = None, running: Callable[[], object] | None = None) -> str:
    """Execute ``code`` in a kernel over its websocket; the text it printed (stdout, stderr, its result, an error's
    name and value), and what came on the kernel's channel ``then_s`` seconds after it finished. With ``until``: as
    soon as that text has been printed, the cell still running. ``running`` is called once the kernel runs the cell
    (what the kernel prints before then belongs to the cell before)."""
    return asyncio.run(_run_cell(session, kernel_id, code, timeout_s, then_s, until, running))


async def _run_cell(session: Session, kernel_id: str, code: str, timeout_s: float, then_s: float,
                    until: str | None, running: Callable[[], object] | None) -> str:
    from tornado.websocket import websocket_connect

    url = f"ws://{session.address}:{session.port}/api/kernels/{kernel_id}/channels?token={session.token}"
    ws = await websocket_connect(url)
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "test", "session": uuid.uuid4().hex,
              "version": "5.3", "date": ""}
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}
    await ws.write_message(json.dumps(
        {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}))
    out: list[str] = []
    loop = asyncio.get_running_loop()
    deadline, done_at = loop.time() + timeout_s, None
    while loop.time() < (deadline if done_at is None else done_at + then_s):
        left = (deadline if done_at is None else done_at + then_s) - loop.time()
        try:
            raw = await asyncio.wait_for(ws.read_message(), max(left, 0.01))
        except asyncio.TimeoutError:
            break
        if raw is None:
            break
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, body = msg["msg_type"], msg["content"]
        if kind == "stream":
            out.append(body["text"])
            if until is not None and until in "".join(out):
                done_at = loop.time()
                break
        elif kind in ("execute_result", "display_data"):
            out.append(body["data"].get("text/plain", "") + "\n")
        elif kind == "error":
            out.append(f"{body['ename']}: {body['evalue']}\n")
        elif kind == "status" and body["execution_state"] == "busy" and running is not None:
            running()
            running = None
        elif kind == "status" and body["execution_state"] == "idle" and done_at is None:
            done_at = loop.time()
            if not then_s:
                break
    ws.close()
    if done_at is None:
        raise TimeoutError(f"the cell did not finish in {timeout_s} s: {''.join(out)!r}")
    return "".join(out)
