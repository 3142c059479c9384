"""How busy a node's GPUs are, sampled once per node: the task shim of the job step's local rank 0
(hpctrain.launch.task) reads every GPU the step was given each `[idle] sample_s` seconds and journals
``utilization`` records: per GPU its summary so far (mean and 10th percentile of utilization, peak memory, energy,
the time it was held idle) and a timeline of one point a minute, every REPORT_EVERY readings and when the step
ends.

Two sources read a GPU. NVML, through nvidia-ml-py, where the node has a driver (kind ``nvml``: SM utilization,
memory, power). Else each local rank's processes (kind ``cpu``: the dev cluster's fake GPUs, a node without a
driver): the GPU at position i of the step's GPUs stands for local rank i, busy as the CPU time of that rank's
processes over wall time (one core = 100 %), so that a rank that does nothing reads as an idle GPU. A node that
cannot be read at all is never a failure of the job: the sampler says why in its record, or samples nothing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from hpctrain.contract import UTILIZATION
from hpctrain.errors import HpctrainError

if TYPE_CHECKING:
    from hpctrain.config.job import Interactive
    from hpctrain.config.policies import IdlePolicy
    from hpctrain.contract import JobEnvironment
    from hpctrain.ledger.journal import Journal
    from hpctrain.runtime.idle_cancel import IdleCancel

REPORT_EVERY = 12  # readings a record (a minute at the default 5 s), and one when the step ends
MINUTE = 60.0  # the timeline's resolution
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
CHILDREN_LISTS = os.path.exists(f"/proc/self/task/{os.getpid()}/children")  # the kernel's CONFIG_PROC_CHILDREN


@dataclass(frozen=True)
class Reading:
    """One GPU at one moment: utilization in percent (None: not readable), memory in bytes, power in watts."""

    util: float | None
    mem_used: float | None = None
    mem_total: float | None = None
    power_w: float | None = None


class Source(Protocol):
    kind: str  # "nvml" or "cpu"
    devices: list[str]  # the GPUs read, as Slurm numbers them

    def read(self) -> list[Reading]: ...

    def close(self) -> None: ...


class NvmlSource:
    """The step's GPUs through NVML, matched by minor number (Slurm's gres index); raises where NVML cannot
    read them (no library, no driver, none of them visible)."""

    kind = "nvml"

    def __init__(self, gpu_ids: list[str]):
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        try:
            found = {}
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                found[str(pynvml.nvmlDeviceGetMinorNumber(handle))] = handle
            self.devices = [gpu for gpu in gpu_ids if gpu in found]
            if not self.devices:
                raise LookupError(f"NVML sees GPUs {sorted(found)}, not the step's {gpu_ids}")
            self.handles = [found[gpu] for gpu in self.devices]
        except Exception:
            pynvml.nvmlShutdown()
            raise

    def read(self) -> list[Reading]:
        return [self._read(handle) for handle in self.handles]

    def _read(self, handle: Any) -> Reading:
        nvml = self.nvml
        try:
            util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError:  # a GPU fallen off the bus, a reset: this reading is missing, not the sampler
            return Reading(None)
        try:
            power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except nvml.NVMLError:  # not every board reports it
            power = None
        return Reading(util, float(memory.used), float(memory.total), power)

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def _stat(pid: int) -> tuple[int, float, float] | None:
    """Process ``pid``'s parent, CPU seconds and resident bytes, from /proc; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()  # past the command name, which may hold spaces
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, float(int(fields[21]) * PAGE)


def _children(pid: int) -> list[int]:
    """The child processes of ``pid``: the kernel's list of each of its threads' (none once it is gone)."""
    out: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(child) for child in f.read().split())
        except OSError:  # the thread ended meanwhile
            continue
    return out


def _scanned_children() -> Callable[[int], list[int]]:
    """Where the kernel keeps no children lists: every process of the host read once, as parent -> children."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            children.setdefault(stat[0], []).append(int(name))
    return lambda pid: children.get(pid, [])


def _local_rank(pid: int) -> int | None:
    """The SLURM_LOCALID of process ``pid`` (a task of this job step), None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(b"SLURM_LOCALID="):
                    return int(entry.split(b"=", 1)[1])
    except (OSError, ValueError):
        pass
    return None


class ProcessSource:
    """Each local rank's processes as its GPU (kind ``cpu``): the tasks of this job step on this node are the
    children of its slurmstepd (this shim's parent), each the shim of one local rank; a rank's processes are its
    shim's descendants (the shim itself, which samples, left out). Only the step's own processes are read, through
    the kernel's children lists, however many others the node runs (a scan of /proc where it keeps none)."""

    kind = "cpu"

    def __init__(self, gpu_ids: list[str], step_pid: int | None = None):
        self.devices = list(gpu_ids)
        self.step_pid = os.getppid() if step_pid is None else step_pid
        self.shims: dict[int, int] = {}  # local rank -> its shim's pid
        self.last: tuple[float, list[float], frozenset[int]] | None = None  # time, CPU and shims of a read
        self.memory = float(os.sysconf("SC_PHYS_PAGES") * PAGE)

    def read(self) -> list[Reading]:
        now = time.monotonic()
        children = _children if CHILDREN_LISTS else _scanned_children()
        # A child read between its fork and exec has its parent's environment, no SLURM_LOCALID: asked again each time.
        for pid in children(self.step_pid):
            if pid not in self.shims.values() and (rank := _local_rank(pid)) is not None:
                self.shims[rank] = pid
        cpu, rss = [], []
        for rank in range(len(self.devices)):
            below = _descendants(children, self.shims[rank]) if rank in self.shims else []
            stats = [stat for stat in map(_stat, below) if stat is not None]
            cpu.append(sum(stat[1] for stat in stats))
            rss.append(sum(stat[2] for stat in stats))
        last, self.last = self.last, (now, cpu, frozenset(self.shims))
        if last is None or now <= last[0]:
            return [Reading(None, m, self.memory) for m in rss]
        wall, known = now - last[0], last[2]
        return [  # a rank whose shim is new: this reading is the baseline of its CPU time, as the first is of all
            Reading(min(100.0, max(0.0, 100.0 * (c - before) / wall)) if rank in known else None, m, self.memory)
            for rank, (c, before, m) in enumerate(zip(cpu, last[1], rss, strict=True))
        ]

    def close(self) -> None:
        pass


def _descendants(children: Callable[[int], list[int]], root: int) -> list[int]:
    out, todo = [], list(children(root))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children(pid))
    return out


def open_source(gpu_ids: list[str]) -> tuple[Source, str | None]:
    """NVML's reading of ``gpu_ids``, else the processes' (and why NVML could not)."""
    try:
        return NvmlSource(gpu_ids), None
    except ImportError:
        why = "nvidia-ml-py is not installed"
    except Exception as exc:  # the binding raises NVMLError subclasses, ctypes OSError, ...
        why = f"NVML: {exc}"
    return ProcessSource(gpu_ids), why


@dataclass
class GpuSummary:
    """One GPU's readings summed over time: each reading stands for the seconds since the one before."""

    samples: int = 0
    seconds: float = 0.0
    busy: float = 0.0  # utilization x seconds
    histogram: list[float] = field(default_factory=lambda: [0.0] * 101)  # seconds at each whole percent
    mem_peak: float | None = None
    mem_total: float | None = None
    energy_j: float = 0.0
    idle_s: float = 0.0  # in stretches idle at least the policy's after_minutes
    idle_now_s: float = 0.0  # the current stretch idle (0: busy now)
    minute: tuple[float, float, float, float | None] | None = None  # the timeline's open minute

    def add(self, reading: Reading, seconds: float, at: float, below: float, after_s: float) -> tuple | None:
        """Fold in ``reading`` at ``at``; the finished minute of the timeline (start, mean util, peak memory) once
        ``at`` is past it."""
        if reading.mem_used is not None:
            self.mem_peak = max(self.mem_peak or 0.0, reading.mem_used)
            self.mem_total = reading.mem_total
        if reading.util is None:
            return None
        self.samples += 1
        self.seconds += seconds
        self.busy += reading.util * seconds
        self.histogram[min(100, int(reading.util))] += seconds
        if reading.power_w is not None:
            self.energy_j += reading.power_w * seconds
        if reading.util < below:
            self.idle_now_s += seconds
            if self.idle_now_s >= after_s:  # the whole stretch counts once it is long enough
                self.idle_s += seconds if self.idle_now_s - seconds >= after_s else self.idle_now_s
        else:
            self.idle_now_s = 0.0
        start = at - at % MINUTE
        done = None
        if self.minute is not None and self.minute[0] != start:
            done = self._point()
            self.minute = None
        m0, m_busy, m_s, m_mem = self.minute or (start, 0.0, 0.0, None)
        mem = reading.mem_used if m_mem is None else max(m_mem, reading.mem_used or 0.0)
        self.minute = (m0, m_busy + reading.util * seconds, m_s + seconds, mem)
        return done

    def _point(self) -> tuple[float, float, float | None]:
        assert self.minute is not None
        start, busy, seconds, mem = self.minute
        return (start, busy / seconds if seconds else 0.0, mem)

    def close_minute(self) -> tuple[float, float, float | None] | None:
        """The timeline's open minute as it stands, closed (the step ends)."""
        point = self._point() if self.minute is not None else None
        self.minute = None
        return point

    def percentile(self, q: float) -> float | None:
        """The utilization under which ``q`` of the time was spent (whole percents)."""
        if not self.seconds:
            return None
        below = 0.0
        for percent, seconds in enumerate(self.histogram):
            below += seconds
            if below >= q * self.seconds:
                return float(percent)
        return 100.0

    def record(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "seconds": round(self.seconds, 3),
            "mean": round(self.busy / self.seconds, 2) if self.seconds else None,
            "p10": self.percentile(0.10),
            "mem_peak": self.mem_peak,
            "mem_total": self.mem_total,
            "energy_j": round(self.energy_j, 1),
            "idle_s": round(self.idle_s, 3),
            "idle_now_s": round(self.idle_now_s, 3),
        }


class NodeSampler:
    """Reads ``source`` every ``sample_s`` seconds in a thread of its own and hands a ``utilization`` record to
    ``write`` every REPORT_EVERY readings and at `stop`: the source's kind (and why not NVML), the policy it counts
    idleness by, and per GPU its summary and the timeline's minutes finished since the record before."""

    def __init__(
        self,
        source: Source,
        write: Callable[[dict[str, Any]], object],
        sample_s: float,
        below_percent: float,
        after_minutes: float,
        alert_minutes: float,
        why: str | None = None,
        idle_cancel: IdleCancel | None = None,
    ):
        self.source, self.write, self.sample_s, self.why = source, write, sample_s, why
        self.idle_cancel, self.cancelled = idle_cancel, False
        self.below, self.after_s, self.alert_s = below_percent, after_minutes * 60, alert_minutes * 60
        self.gpus = [GpuSummary() for _ in source.devices]
        self.points: list[list[Any]] = []  # [minute start, device, mean util, peak memory]
        self.cost_s = 0.0  # this thread's CPU time spent reading
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpctrain-utilization", daemon=True)

    def start(self) -> NodeSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        last = time.time()
        self.sample(last, 0.0)  # the baseline of CPU time; NVML's first reading counts for nothing
        readings = 0
        while not self._stop.wait(self.sample_s):
            now = time.time()
            self.sample(now, now - last)
            last, readings = now, readings + 1
            if readings % REPORT_EVERY == 0:
                self.report(final=False)
        now = time.time()
        self.sample(now, now - last)

    def sample(self, at: float, seconds: float) -> None:
        started = time.thread_time()
        try:
            readings = self.source.read()
        except Exception:  # noqa: BLE001 - a node that cannot be read this time fails no job
            readings = [Reading(None)] * len(self.gpus)
        for device, (gpu, reading) in enumerate(zip(self.gpus, readings, strict=True)):
            if (point := gpu.add(reading, seconds, at, self.below, self.after_s)) is not None:
                self.points.append([point[0], self.source.devices[device], round(point[1], 2), point[2]])
        self.cost_s += time.thread_time() - started
        if self.idle_cancel is not None and self.gpus:
            try:
                ended = self.idle_cancel.check(min(gpu.idle_now_s for gpu in self.gpus), at)
            except (OSError, HpctrainError) as exc:  # the job runs on; the next reading tries again
                print(f"hpctrain: GPUs idle, the job not ended this time: {exc}", file=sys.stderr, flush=True)
                ended = False
            if ended and not self.cancelled:  # the idle time journaled before Slurm ends the step
                self.cancelled = True
                self.report(final=False)

    def report(self, final: bool) -> None:
        """A record of the summaries so far (a journal that cannot be written loses it, not the job)."""
        points, self.points = self.points, []
        with contextlib.suppress(OSError):
            self._write(points, final)

    def _write(self, points: list[list[Any]], final: bool) -> None:
        self.write(
            {
                "source": self.source.kind,
                "why": self.why,
                "sample_s": self.sample_s,
                "policy": {"below_percent": self.below, "after_s": self.after_s, "alert_s": self.alert_s},
                "final": final,
                "cost_s": round(self.cost_s, 4),
                "gpus": {d: gpu.record() for d, gpu in zip(self.source.devices, self.gpus, strict=True)},
                "timeline": points,
            }
        )

    def stop(self) -> None:
        """The last reading, the last record (the open minute of each GPU with it), the source closed."""
        self._stop.set()
        self._thread.join()
        for device, gpu in zip(self.source.devices, self.gpus, strict=True):
            if (point := gpu.close_minute()) is not None:
                self.points.append([point[0], device, round(point[1], 2), point[2]])
        self.report(final=True)
        self.source.close()


class NodeSampling:
    """This node's sampler for an hpctrain job step, started and stopped by the shim of its local rank 0: the
    policy read and the source opened in a thread of their own, so that the rank starts at once."""

    def __init__(self, env: JobEnvironment, journal: Journal):
        self.sampler: NodeSampler | None = None
        self._opening = threading.Thread(target=self._open, args=(env, journal), daemon=True)
        self._opening.start()

    def _open(self, env: JobEnvironment, journal: Journal) -> None:
        from hpctrain.runtime.idle_cancel import IdleCancel

        try:
            policy, session = job_idle_policy(env)
            source, why = open_source(env.gpu_ids)
            values = (policy.sample_s, policy.below_percent, policy.after_minutes, policy.alert_minutes)
            assert all(v is not None for v in values)
            end = idle_end(policy, session, source.kind)
            cancel = IdleCancel(env, *end, journal) if end is not None and env.job_dir is not None else None
            self.sampler = NodeSampler(
                source,
                lambda record: journal.write(UTILIZATION, **record),
                *values,  # type: ignore[arg-type]
                why=why,
                idle_cancel=cancel,
            )
            self.sampler.start()
        except Exception as exc:  # noqa: BLE001 - the job runs on, unsampled, and its log says why in a line
            print(f"hpctrain: GPU use not sampled on this node: {exc}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        self._opening.join()
        if self.sampler is not None:
            self.sampler.stop()


def job_idle_policy(env: JobEnvironment) -> tuple[IdlePolicy, Interactive | None]:
    """The job's [idle] over its site's, over the defaults, and its interactive session if it is one; the defaults
    and no session where the spec cannot be read (the sampler fails no job)."""
    from hpctrain.config.job import load_job_spec
    from hpctrain.config.policies import IdlePolicy
    from hpctrain.config.site import job_site
    from hpctrain.errors import HpctrainError

    try:
        site = job_site()
        spec = load_job_spec(env.spec_file) if env.spec_file is not None else None
        own = spec.idle if spec is not None else IdlePolicy()
        return own.over(site.idle if site else IdlePolicy()), spec.interactive if spec is not None else None
    except (HpctrainError, OSError):
        return IdlePolicy().resolved(), None


def idle_end(policy: IdlePolicy, session: Interactive | None, kind: str) -> tuple[float, str] | None:
    """How long every GPU of a node may stay idle before its run is ended, and the setting that says so (None:
    never): `cancel_minutes` under `action = "cancel"`; for an interactive session whose GPUs NVML reads, its
    `idle_minutes` at most, so that a kernel busy on the CPU alone does not hold GPUs for nothing. (Read from the
    processes, a session's GPU is as busy as its kernels, which Jupyter's own culling ends already.)"""
    limits = []
    if policy.action == "cancel" and policy.cancel_minutes is not None:
        limits.append(
            (policy.cancel_minutes * 60, f'[idle] action = "cancel", cancel_minutes = {policy.cancel_minutes:g}')
        )
    if session is not None and kind == "nvml":
        limits.append((session.idle_minutes * 60, f"the session's idle_minutes = {session.idle_minutes:g}"))
    return min(limits, default=None)
