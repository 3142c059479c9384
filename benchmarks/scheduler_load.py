"""Scheduler load at real scale: slurmctld and slurmdbd RPCs per minute while hpctrain watches 1,000 separate jobs
and a 10,000-trial sweep, against submitit watching the same jobs, in one run on the live dev cluster.

    scripts/dev-cluster up && .venv/bin/python benchmarks/scheduler_load.py [--jobs 1000] [--trials 10000] [--minutes 2]

Method: the jobs (one Submitter call and one sbatch each) and the sweep (registered; its first tick submits every
trial, in arrays split at MaxArraySize) go to Slurm held, from a fresh ledger, so nothing runs and only watching
costs the scheduler. Once slurmctld has sent slurmdbd all it queued, three windows of the same length follow, each
between snapshots of slurmctld's RPC counters (sdiag) and slurmdbd's (`sacctmgr show stats`):

  nobody watching  the background (a check: no client RPCs);
  hpctrain         `hpctrain status --watch` at its default interval and backoff, with `hpctrain reconcile` and
                   `hpctrain sweep tick` started together every minute from the window's start, as cron would;
  submitit         submitit.helpers.monitor_jobs (submitit's own watcher, default poll_frequency) over
                   submitit.SlurmJob objects for the same jobs and array tasks.

What a pair of snapshots costs by itself is measured first and taken off every window. Counted are the RPCs of
client commands (requests to slurmctld; connections and queries to slurmdbd); what comes whoever watches (slurmd's
node registrations, slurmctld's reports to slurmdbd) is shown apart. Slurm commands are counted by PATH wrappers.
Then one sacct call over all the jobs is measured as hpctrain makes it, without AllocTRES, and as submitit makes it.
Every job is cancelled at the end, also on error.
"""

from __future__ import annotations

import argparse
import inspect
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from submitit import SlurmJob
from submitit.helpers import monitor_jobs
from submitit.slurm.slurm import SlurmInfoWatcher

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteConfig
from hpctrain.ledger import Ledger
from hpctrain.slurm import sacct
from hpctrain.slurm.client import CLIENT_COMMANDS, SlurmClient
from hpctrain.submit import Submitter
from hpctrain.sweep import store
from hpctrain.sweep.spec import SweepSpec
from hpctrain.sweep.tick import tick_all

from _figures import figure
from _timing import TimedClient

HPCTRAIN = [sys.executable, "-m", "hpctrain"]
DAEMONS = ("slurmctld", "slurmdbd")
# What client commands send: slurmctld requests; slurmdbd a connection, queries and its end. The rest comes whoever
# watches (slurmd's node registrations, slurmctld's reports to slurmdbd) and is kept apart as background.
CLIENT = {"slurmctld": re.compile(r"^REQUEST_"), "slurmdbd": re.compile(r"^(SLURM_PERSIST_INIT|DBD_FINI|DBD_GET_\w+)$")}
_RPC = re.compile(r"^\s+(\w+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:\d+\s+total_time:(\d+)")
_NEXT_POLL = re.compile(r"^next poll in ([\d.]+)s")
POLL_FREQUENCY = inspect.signature(monitor_jobs).parameters["poll_frequency"].default
JOB = {"command": ["true"], "launcher": "none", "resources": {"mem": "100M", "time": "5"}}


@dataclass
class Load:
    """RPCs received by one daemon, and its time answering them (µs), by message type."""

    count: Counter[str]
    micros: Counter[str]

    def __sub__(self, other: Load) -> Load:
        return Load(self.count - other.count, self.micros - other.micros)

    def less(self, calls: Counter[str]) -> Load:
        """Without ``calls`` (by type), each taking its type's mean time."""
        count = self.count - calls
        return Load(count, Counter({t: self.micros[t] * n / self.count[t] for t, n in count.items()}))

    def only(self, types: re.Pattern[str], keep: bool = True) -> Load:
        """The message types that match ``types`` (``keep``) or the others."""
        return Load(*(Counter({t: n for t, n in c.items() if bool(types.match(t)) == keep})
                      for c in (self.count, self.micros)))


def rpc_stats(*argv: str) -> Load:
    """The 'by message type' section of sdiag or `sacctmgr show stats`."""
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    section = out.split("by message type", 1)[1].split("by user", 1)[0]
    rows = [m for m in map(_RPC.match, section.splitlines()) if m]
    return Load(Counter({m[1]: int(m[2]) for m in rows}), Counter({m[1]: int(m[3]) for m in rows}))


def snapshot() -> dict[str, Load]:
    return {"slurmctld": rpc_stats("sdiag"), "slurmdbd": rpc_stats("sacctmgr", "show", "stats")}


def drain_dbd_queue(timeout_s: float = 300) -> float:
    """Wait until slurmctld has sent slurmdbd every record it queued (the jobs just submitted); seconds waited."""
    t0 = time.monotonic()
    while True:
        out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
        queued = int(re.search(r"DBD Agent queue size:\s*(\d+)", out)[1])
        if not queued:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"slurmctld still queues {queued} records for slurmdbd after {timeout_s:g} s")
        time.sleep(1)


@dataclass
class Window:
    name: str
    seconds: float
    load: dict[str, Load]
    commands: Counter[str]
    note: str = ""

    def per_min(self, daemon: str) -> tuple[float, float]:
        """(RPCs, milliseconds of the daemon's time) per minute."""
        load, minutes = self.load[daemon], self.seconds / 60
        return sum(load.count.values()) / minutes, sum(load.micros.values()) / 1000 / minutes


class Meter:
    """Measures windows: snapshots around each, less what a pair of snapshots costs; Slurm commands by PATH wrappers."""

    def __init__(self, workdir: Path):
        self.bin_dir, self.log = workdir / "slurm-bin", workdir / "slurm-calls.log"
        self.bin_dir.mkdir()
        for cmd in CLIENT_COMMANDS:
            wrapper = self.bin_dir / cmd
            wrapper.write_text(f'#!/bin/bash\necho {cmd} >> {self.log}\nexec {shutil.which(cmd)} "$@"\n')
            wrapper.chmod(0o755)
        self.path = f"{self.bin_dir}:{os.environ['PATH']}"
        first = snapshot()
        self.overhead = {d: (load - first[d]).count for d, load in snapshot().items()}

    def measure(self, name: str, seconds: float, watch: Callable[[float], str]) -> Window:
        self.log.unlink(missing_ok=True)
        before = snapshot()
        note = watch(seconds)
        after = snapshot()
        commands = Counter(self.log.read_text().split()) if self.log.exists() else Counter()
        load = {d: (after[d] - before[d]).less(self.overhead[d]) for d in DAEMONS}
        for d in DAEMONS:
            load[f"{d} background"], load[d] = load[d].only(CLIENT[d], False), load[d].only(CLIENT[d])
        return Window(name, seconds, load, commands, note)

    def calls(self, call: Callable[[], int], repeats: int) -> tuple[Load, int]:
        """slurmdbd's load from ``repeats`` calls of ``call``, and the rows the last one returned."""
        before = snapshot()
        for _ in range(repeats):
            rows = call()
        return (snapshot()["slurmdbd"] - before["slurmdbd"]).less(self.overhead["slurmdbd"]), rows


def hpctrain_watch(env: dict[str, str], workdir: Path) -> Callable[[float], str]:
    """`hpctrain status --watch` for the window, `hpctrain reconcile` and `hpctrain sweep tick` each minute."""

    def watch(seconds: float) -> str:
        out, log = workdir / "status-watch.json", workdir / "status-watch.log"
        with out.open("w") as stdout, log.open("w") as stderr:
            status = subprocess.Popen([*HPCTRAIN, "status", "--watch", "--json"], env=env, stdout=stdout, stderr=stderr)
        start = time.monotonic()
        try:
            for at in range(0, int(seconds), 60):
                time.sleep(max(0.0, start + at - time.monotonic()))
                cron = [subprocess.Popen([*HPCTRAIN, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True) for argv in (["reconcile"], ["sweep", "tick"])]
                for proc in cron:
                    said = proc.communicate()[0]
                    if proc.returncode != 0:
                        raise RuntimeError(f"{' '.join(proc.args[2:])} failed: {said}")
            time.sleep(max(0.0, start + seconds - time.monotonic()))
            if status.poll() is not None:
                raise RuntimeError(f"status --watch exited early: {log.read_text()}")
        finally:
            status.terminate()
            status.wait()
        waits = [m[1] for m in map(_NEXT_POLL.match, log.read_text().splitlines()) if m]
        return (f"status --watch at its default interval and backoff polled {len(out.read_text().splitlines())} "
                f"times, waiting {', '.join(waits)} s between polls")

    return watch


def idle(seconds: float) -> str:
    time.sleep(seconds)
    return ""


def submitit_monitor(folder: Path, job_ids: list[str], path: str) -> None:
    """submitit's own monitoring loop over the jobs, as a user runs it; until terminated."""
    os.environ["PATH"] = path
    with (folder / "monitor.log").open("w") as out, redirect_stdout(out):
        monitor_jobs([SlurmJob(folder, job_id) for job_id in job_ids])


def submitit_watch(folder: Path, job_ids: list[str], path: str) -> Callable[[float], str]:
    def watch(seconds: float) -> str:
        proc = multiprocessing.get_context("fork").Process(target=submitit_monitor, args=(folder, job_ids, path))
        proc.start()
        time.sleep(seconds)
        alive = proc.is_alive()
        proc.terminate()
        proc.join()
        if not alive:
            raise RuntimeError(f"submitit's monitor_jobs exited early (exit {proc.exitcode})")
        return f"monitor_jobs at its default poll_frequency, {POLL_FREQUENCY:g} s"

    return watch


def sacct_calls(meter: Meter, site: SiteConfig, ledger: Ledger, ids: list[str], repeats: int = 3) -> None:
    """One poll's sacct call over every watched job, as hpctrain makes it (with and without AllocTRES) and as
    submitit's watcher makes it."""
    client = SlurmClient.for_site(site)
    jobs = [r[0] for r in ledger.db.execute("SELECT slurm_job_id FROM jobs WHERE slurm_job_id IS NOT NULL")]
    watcher = SlurmInfoWatcher()
    for job_id in ids:
        watcher.register_job(job_id)
    argv = watcher._make_command()
    lean = tuple(f for f in sacct.FIELDS if f != "AllocTRES")
    calls = {
        f"hpctrain: sacct -X -D --format={','.join(sacct.FIELDS)}": lambda: len(client.sacct(jobs, sacct.FIELDS)),
        "hpctrain's without AllocTRES": lambda: len(client.sacct(jobs, lean)),
        f"submitit: {' '.join(argv[:4])} (steps too)": lambda: len(subprocess.run(
            argv, capture_output=True, text=True, check=True).stdout.splitlines()) - 1,
    }
    print(f"\n| one sacct call over the {len(jobs)} Slurm jobs (mean of {repeats}) | rows | slurmdbd RPCs "
          "| slurmdbd busy ms | slurmdbd RPCs by type |")
    print("|---|---:|---:|---:|---|")
    for name, call in calls.items():
        load, rows = meter.calls(call, repeats)
        types = ", ".join(f"{t} {c / repeats:g}" for t, c in load.count.most_common())
        print(f"| {name} | {rows} | {sum(load.count.values()) / repeats:g} | "
              f"{sum(load.micros.values()) / 1000 / repeats:.1f} | {types} |")


def submit(site: SiteConfig, ledger: Ledger, jobs: int, trials: int, workdir: Path) -> list[str]:
    """``jobs`` single held jobs and a sweep of ``trials`` held trials; what submitit is to watch: job ids, and
    ``<array>_<task>`` for each trial."""
    client = TimedClient.for_site(site)
    client.held = True
    t0 = time.perf_counter()
    single = JobSpec.model_validate({"name": "load-single", **JOB})
    submitter = Submitter(site, ledger, client)
    for _ in range(jobs):
        submitter.submit(single, "<bench>")
    spec = SweepSpec.model_validate({
        "name": "load-sweep", "method": "random", "metric": "loss", "direction": "minimize",
        "max_trials": trials, "max_parallel": trials,
        "search": {"lr": {"type": "loguniform", "low": 1e-5, "high": 1e-1}}, "job": {"name": "load-trial", **JOB},
    })
    sweep, _ = store.register(ledger, spec, workdir / "sweep.toml")
    submitted = len(tick_all(ledger, client, site, [sweep.id])[0].submitted)
    ids = [sid if task is None else f"{sid}_{task}" for sid, task in ledger.db.execute(
        "SELECT j.slurm_job_id, t.task_index FROM jobs j LEFT JOIN array_tasks t ON t.job_id = j.id")]
    print(f"submitted held: {jobs} single jobs, a sweep of {submitted} trials ({client.calls['sbatch']} sbatch calls) "
          f"in {time.perf_counter() - t0:.0f} s; {len(ids)} job ids and array tasks to watch")
    return ids


def cancel_all(site: SiteConfig, ledger: Ledger) -> None:
    ids = [r[0] for r in ledger.db.execute("SELECT slurm_job_id FROM jobs WHERE slurm_job_id IS NOT NULL")]
    SlurmClient.for_site(site).scancel(ids)
    print(f"cancelled {len(ids)} Slurm jobs")


def top_types(window: Window, daemon: str, n: int) -> str:
    minutes = window.seconds / 60
    return ", ".join(f"{t} {c / minutes:.1f}" for t, c in window.load[daemon].count.most_common(n))


def report(windows: list[Window]) -> None:
    print("\n| watcher | slurmctld RPCs/min | slurmdbd RPCs/min | slurmctld busy ms/min | slurmdbd busy ms/min "
          "| main slurmctld RPCs/min | main slurmdbd RPCs/min | Slurm commands/min |")
    print("|---|---:|---:|---:|---:|---|---|---|")
    for w in windows:
        (ctld, ctld_ms), (dbd, dbd_ms) = w.per_min("slurmctld"), w.per_min("slurmdbd")
        minutes = w.seconds / 60
        commands = ", ".join(f"{k} {c / minutes:.1f}" for k, c in sorted(w.commands.items())) or "-"
        print(f"| {w.name} | {ctld:.1f} | {dbd:.1f} | {ctld_ms:.1f} | {dbd_ms:.1f} "
              f"| {top_types(w, 'slurmctld', 3) or '-'} | {top_types(w, 'slurmdbd', 4) or '-'} | {commands} |")
    for w in windows:
        background = "; ".join(f"{d} {w.per_min(d)[0]:.1f}/min ({top_types(w, d, 3) or '-'})"
                               for d in (f"{d} background" for d in DAEMONS))
        print(f"  {w.name}: {w.note + '; ' if w.note else ''}background, not counted above: {background}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="separate single jobs")
    parser.add_argument("--trials", type=int, default=10_000, help="trials of the sweep (array tasks)")
    parser.add_argument("--minutes", type=float, default=2.0, help="length of each window")
    args = parser.parse_args()
    site = load_site("dev")
    if site.slurm.conf is not None:  # sdiag, sacctmgr and submitit's sacct ask the site's cluster
        os.environ["SLURM_CONF"] = str(site.slurm.conf)
    workdir = Path(tempfile.mkdtemp(prefix="hpctrain-bench-load-"))
    config = SlurmClient.for_site(site).config()
    print(f"Slurm {config['SLURM_VERSION']}: MaxArraySize {config['MaxArraySize']}, "
          f"MaxJobCount {config['MaxJobCount']}")
    seconds = args.minutes * 60
    with Ledger(workdir / "ledger.db") as ledger:
        try:
            ids = submit(site, ledger, args.jobs, args.trials, workdir)
            print(f"slurmctld's queue to slurmdbd drained in {drain_dbd_queue():.0f} s; windows of {seconds:g} s each")
            meter = Meter(workdir)
            env = {**os.environ, "PATH": meter.path, "HPCTRAIN_LEDGER": str(ledger.path)}
            folder = workdir / "submitit"
            folder.mkdir()
            windows = [
                meter.measure("nobody watching (check)", seconds, idle),
                meter.measure("hpctrain: status --watch + reconcile and sweep tick each minute", seconds,
                              hpctrain_watch(env, workdir)),
                meter.measure("submitit: monitor_jobs", seconds, submitit_watch(folder, ids, meter.path)),
            ]
            report(windows)
            sacct_calls(meter, site, ledger, ids)
        finally:
            cancel_all(site, ledger)
    _, ours, theirs = windows
    for daemon in DAEMONS:
        mine, baseline = ours.per_min(daemon)[0], theirs.per_min(daemon)[0]
        if baseline > 0:
            figure(f"{daemon} RPCs/min, hpctrain watchers / submitit (baseline: monitor_jobs)", mine / baseline, "x")
        else:
            figure(f"{daemon} RPCs/min, hpctrain watchers (submitit monitor_jobs: none)", mine, "RPC/min")
    mine, baseline = ours.per_min("slurmdbd")[1], theirs.per_min("slurmdbd")[1]
    figure("slurmdbd busy time, hpctrain watchers / submitit (baseline: monitor_jobs)", mine / baseline, "x")


if __name__ == "__main__":
    main()
