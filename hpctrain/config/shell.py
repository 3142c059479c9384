"""Shell commands users write into the batch script (site and job `setup`): each must stand alone as bash
parses it. An unclosed quote, brace, `$(`, here-document or a trailing backslash would swallow the lines
hpctrain writes after it, and the job would end without ever running its command."""

from __future__ import annotations

import os
import subprocess

# bash reads BASH_ENV even for `-n`; nothing from the caller's environment may change how a line parses.
_ENV = {"PATH": os.defpath, "LC_ALL": "C"}


def _bash_says(script: str) -> tuple[int, str]:
    """bash's exit status and complaint (first line) on parsing ``script`` without running it."""
    try:
        proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, env=_ENV, timeout=30)
    except FileNotFoundError:
        raise ValueError("cannot check it as a shell command: bash is not installed here") from None
    said = proc.stderr.strip().splitlines()
    return proc.returncode, said[0].removeprefix("bash: ") if said else ""


def check_shell_command(value: str) -> str:
    """``value`` when it is a complete shell command, else ValueError saying why."""
    rc, said = _bash_says(value)
    if rc != 0 or said:
        raise ValueError(f"not a complete shell command ({said}): it would swallow the rest of the batch script")
    # A command that ends there makes a lone ';' on the next line a syntax error; one that goes on takes it in.
    if _bash_says(value + "\n;")[0] == 0:
        raise ValueError(
            "not a complete shell command (it goes on into the next line, as after a trailing '\\'): "
            "it would swallow the rest of the batch script"
        )
    return value
