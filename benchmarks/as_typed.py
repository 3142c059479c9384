"""The commands as a user types them, on a heavy user's year (issue 59): each `hpctrain ...` a process of its own,
with its imports, the refresh it does first and its rendering to a terminal of 120 columns (a pseudo-terminal).

    .venv/bin/python benchmarks/as_typed.py [--jobs 1000000] [--repeats 3]

The ledger is benchmarks/ledger_scale.py's heavy mix (tests/helpers/heavy_ledger.py, kept under
/var/tmp/hpctrain-bench-ledger): 1 M jobs, 2,000 active with 24,000 active array tasks, three jobs of 500 k, 200 k
and 100 k metric points, an ended sweep of 1,000 trials. Slurm is answered by stand-ins for `sacct`, `squeue` and
`scontrol` put first on PATH, which print the active jobs' runs as the ledger has them (a poll with nothing new, as
AnsweringSlurm in-process, but for a running job's ElapsedRaw, which grows as real sacct's does); their own CPU time
is taken off the command's. Each figure is the median over the repeats
of the command's CPU seconds (user + system) and its peak RSS, on the ledger as generated (no planner statistics,
as users' ledgers were) and again once analysed. Goals: issue 59's acceptance. `hpctrain version` is measured in the
same minutes: the floor of every command (Python's start, click), and this machine's speed at the time, which varies
by a third from one hour to the next.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import pty
import statistics
import struct
import sys
import tempfile
import termios
import threading
from pathlib import Path

from hpctrain.ledger import Ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _figures import figure  # noqa: E402
from helpers.heavy_ledger import AnsweringSlurm  # noqa: E402
from ledger_scale import heavy_ledger_of, set_statistics  # noqa: E402

HPCTRAIN = Path(sys.executable).with_name("hpctrain")
COLUMNS = 120
# A stand-in Slurm command: answers from ROWS (sacct's rows of the active jobs, by job id), adds its own CPU seconds
# to CPU_LOG (taken off the command's), and refuses what it does not know (so a new call shows up here).
STAND_IN = """#!{python}
import datetime, json, os, sys, time
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
def cell(row, field):  # a running job's ElapsedRaw grows as real sacct's does
    if field == "ElapsedRaw" and row.get("End") == "Unknown" and row.get("Start", "Unknown") != "Unknown":
        return str(int(time.time() - datetime.datetime.fromisoformat(row["Start"]).timestamp()))
    return row.get(field, "")
def value(flag):
    for i, a in enumerate(args):
        if a == flag:
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
try:
    if name == "sacct" and "-j" in args:
        rows = json.load(open({rows!r}))
        fields = value("--format").split(",")
        print("|".join(fields))
        for job in value("-j").split(","):
            for row in rows.get(job, []):
                print("|".join(cell(row, f) for f in fields))
    elif name == "squeue":
        pass  # nothing pending has a reason to give; steps and states: sacct answers
    elif name == "scontrol" and args[:2] == ["show", "config"]:
        print("SLURM_VERSION           = 24.11.5")
    elif name == "scontrol" and args == ["ping"]:
        print("Slurmctld(primary) at stand-in is UP")
    else:
        sys.exit(f"stand-in {{name}}: not answered: {{args}}")
finally:
    t = os.times()
    with open({cpu_log!r}, "a") as log:
        log.write(f"{{t.user + t.system}}\\n")
"""


def stand_ins(folder: Path, ledger: Path) -> Path:
    """The stand-in commands in ``folder``/bin, answering for the active jobs of ``ledger``; their CPU log."""
    with Ledger(ledger) as opened:
        rows = AnsweringSlurm(opened).rows
    (folder / "rows.json").write_text(json.dumps(rows))
    cpu_log = folder / "stand-in-cpu"
    (folder / "bin").mkdir()
    for name in ("sacct", "squeue", "scontrol", "sinfo", "sbatch", "sshare", "sacctmgr", "scancel"):
        path = folder / "bin" / name
        path.write_text(STAND_IN.format(python=sys.executable, rows=str(folder / "rows.json"), cpu_log=str(cpu_log)))
        path.chmod(0o755)
    return cpu_log


def typed(argv: list[str], env: dict[str, str], cpu_log: Path) -> tuple[float, float, int, int]:
    """Run ``hpctrain ARGV`` on a 120-column pseudo-terminal: its CPU seconds (the stand-ins' taken off), peak RSS
    (MiB), exit status and the lines it printed."""
    cpu_log.write_text("")
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, COLUMNS, 0, 0))
    printed = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed with the process
                return
            if not chunk:
                return
            printed.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        for fd in (0, 1, 2):
            os.dup2(follower, fd)
        os.execve(str(HPCTRAIN), [str(HPCTRAIN), *argv], env)
    os.close(follower)
    _, status, usage = os.wait4(pid, 0)
    reader.join()
    os.close(leader)
    stand_in = sum(float(line) for line in cpu_log.read_text().split())
    return (usage.ru_utime + usage.ru_stime - stand_in, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status),
            printed.count(b"\n"))


def commands(ids: dict[str, int], now: float, out: Path) -> dict[str, tuple[list[str], float | None, float | None]]:
    """Each command as typed: its arguments, its CPU-seconds goal and its RSS goal (MiB) from issue 59 (None:
    none)."""
    def day(days_ago: int) -> str:
        return datetime.date.fromtimestamp(now - days_ago * 86400).isoformat()

    long_job, other = ids["long_job"], ids["long_job"] - 1  # 500 k and 200 k points
    return {
        "version (the floor)": (["version"], None, None),
        "status": (["status"], 0.5, None),
        "sweep tick": (["sweep", "tick"], 0.5, None),
        "cost --since a week": (["cost", "--by", "job", "--since", day(7)], 1.0, None),
        "report --account, 30 days": (["report", "--account", "teama", "--since", day(30), "--out",
                                       str(out / "account.html")], 2.0, None),
        "compare of 2 jobs": (["compare", str(long_job), str(other)], 0.5, None),
        "compare --sweep, 1,000 trials": (["compare", "--sweep", f"sweep-{ids['big_sweep']}"], 10.0, None),
        "report JOB, 500 k points": (["report", str(long_job), "--out", str(out / "job.html")], 2.0, 200.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", default=[], metavar="TEXT", help="the commands whose names hold TEXT")
    args = parser.parse_args()
    path, now, ids = heavy_ledger_of(args.jobs, 365)
    with tempfile.TemporaryDirectory(prefix="hpctrain-typed-") as tmp:
        folder = Path(tmp)
        cpu_log = stand_ins(folder, path)
        env = {**os.environ, "PATH": f"{folder / 'bin'}:{os.environ['PATH']}", "HPCTRAIN_LEDGER": str(path),
               "HPCTRAIN_SITE": "dev", "COLUMNS": str(COLUMNS), "TERM": "xterm-256color", "HOME": str(folder)}
        env.pop("SLURM_CONF", None)
        typed_commands = {name: command for name, command in commands(ids, now, folder).items()
                          if not args.only or any(text in name for text in [*args.only, "the floor"])}
        results: dict[tuple[str, bool], list[tuple[float, float, int, int]]] = {}
        for analysed in (False, True):
            with Ledger(path) as ledger:
                set_statistics(ledger, analysed)
            for name, (argv, _, _) in typed_commands.items():
                typed(argv, env, cpu_log)  # warm-up: page cache, and what a first run writes
                results[name, analysed] = [typed(argv, env, cpu_log) for _ in range(args.repeats)]
    size = path.stat().st_size / 2**30
    print(f"as typed, heavy mix of {args.jobs:,} jobs ({size:.1f} GiB), median of {args.repeats}: CPU s (peak RSS MiB)"
          f", lines printed")
    print(f"  {'command':32}{'no statistics':>20}{'analysed':>20}{'lines':>8}{'goal':>8}")
    for name, (argv, goal_s, goal_mb) in typed_commands.items():
        cells = []
        for analysed in (False, True):
            runs = results[name, analysed]
            failed = [r for r in runs if r[2] != 0]
            if failed:
                sys.exit(f"{name} ({' '.join(argv)}) exited {failed[0][2]}")
            cpu, rss = statistics.median(r[0] for r in runs), max(r[1] for r in runs)
            cells.append(f"{cpu:8.3f} ({rss:5.0f})")
            how = "analysed" if analysed else "no statistics"
            if goal_s is None:
                figure(f"as typed: {name}, {args.jobs:,} jobs, {how}", cpu, "CPU s")
            else:
                figure(f"as typed: {name}, {args.jobs:,} jobs, {how}", cpu, "CPU s", f"<= {goal_s:g} (issue 59)",
                       cpu <= goal_s)
            if goal_mb is not None:
                figure(f"as typed: {name}, peak RSS, {how}", rss, "MiB", f"<= {goal_mb:g} (issue 59)", rss <= goal_mb)
        goal = "-" if goal_s is None else f"{goal_s:g}"
        print(f"  {name:32}{cells[0]:>20}{cells[1]:>20}{results[name, False][0][3]:8d}{goal:>8}")


if __name__ == "__main__":
    main()
