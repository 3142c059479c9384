"""Fixtures every test folder shares (the live dev cluster, an isolated ledger per test, ...); the plain helpers
are in the helpers package (tests/helpers/), which no test reaches through this file."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.files import exclusive_lock

from helpers.cluster import DEV_CLUSTER, SHIMMED, SlurmLog, short_share_cluster, slurm_shims, worker_cluster
from helpers.paths import ASSETS, REPO, run_folder
from helpers.wheels import (LOGIN_PYTHONS, PICK_PYTHON, PYTHONS, TORCH_EXTRAS, Resolution, claimed, interpreter,
                            metadata, venv_with)

os.environ["OMP_NUM_THREADS"] = "1"
# Bytecode is written, whatever the machine's environment says (a CI image may set PYTHONDONTWRITEBYTECODE): else
# each of the run's Python processes compiles the hpctrain modules it imports again (0.04 CPU-s for `hpctrain status`),
# each process of the tests' venvs (installed by uv, without bytecode) mlflow's or torch's, and each xdist worker
# rewrites every test module's asserts (6 CPU-s). Set before the workers start.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# pytest-xdist's workers start with COLUMNS=80 and LINES=24 (execnet sets them), which a plain run has not: hpctrain's
# tables and lines follow $COLUMNS, so a test's `hpctrain` read 80 columns under xdist and 160 alone.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# Each test's seconds (setup, call and teardown) in a run of the whole suite: pytest-xdist runs the longest first.
DURATIONS = ASSETS / "durations.json"
# A cluster test recorded as taking less is a short one (`--cluster-share`): 99 of 137, 1,290 of 5,620 s.
SHORT_TEST_S = 45.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", action="store_true",
                     help=f"merge this run's test durations into {DURATIONS.relative_to(REPO)}")
    parser.addoption("--cluster-share", choices=("long", "short"),
                     help=f"run only the cluster tests recorded as taking {SHORT_TEST_S:.0f} s or more (long; with "
                          "the ones not recorded) or less (short, against a cluster of its own), so that scripts/test "
                          "runs the short ones in a session of their own beside the long ones")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (with --maxschedchunk 1), the cluster tests longest first by their recorded durations, a
    test not recorded first of all: the workers then end together, not one of them alone with a long test at the
    end. The workers' order is the one the controller schedules by (xdist leaves ``numprocesses`` unset on them).
    The tests without the cluster keep their files' order: ordered by duration, the ones that mostly wait (hangs,
    idle timeouts) came last together, the CPU idle, and the run took 395 s instead of 315.

    With ``--cluster-share``, only that share of the cluster tests. The short ones mostly wait on Slurm: after the
    long ones on the same two workers, they were CI's last 7 minutes at half its CPU."""
    known = json.loads(DURATIONS.read_text())
    if share := config.getoption("cluster_share"):
        short = share == "short"
        chosen = {id(item) for item in items if item.get_closest_marker("slurm")
                  and (known.get(item.nodeid, math.inf) < SHORT_TEST_S) == short}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in chosen])
        items[:] = [item for item in items if id(item) in chosen]
    if "PYTEST_XDIST_WORKER" in os.environ:
        items.sort(key=lambda item: -known.get(item.nodeid, math.inf) if item.get_closest_marker("slurm") else 0)


@functools.cache
def _grouped(path: str) -> bool:
    """Whether the test module at ``path`` (relative to the repository) marks its tests `xdist_group`."""
    try:
        return "pytest.mark.xdist_group(" in (REPO / path).read_text()
    except OSError:
        return False


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadgroup` as its docs say: pytest-xdist 3.8 groups by a suffix it writes into ``item._nodeid``, which
    pytest 9 no longer reads, so the tests of a group went to every worker (an `mlflow server` started on each, the
    Gluster server one group's tests kill shared by two at once). Here a module that marks its tests `xdist_group`
    is one scope, sent whole to one worker; every other test is a scope of its own, as under `--dist load`."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroupedModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if _grouped(path) else nodeid

    return ByGroupedModule(config, log)


_took: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _took[report.nodeid] = _took.get(report.nodeid, 0.0) + report.duration


def _untracked() -> set[str]:
    """The files git would list as new in the checkout (none outside a git checkout)."""
    done = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-o", "--exclude-standard", "--directory"],
                          capture_output=True, text=True, check=False)
    return set(done.stdout.split("\0")) - {""} if done.returncode == 0 else set()


_untracked_at_start: set[str] = set()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _untracked_at_start.update(_untracked())


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On the controller (the only process or xdist's): a test that left files in the checkout (a relative path
    made in pytest's working directory) fails the run; with --record-durations, the durations merged in."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if left := sorted(_untracked() - _untracked_at_start):
        print(f"\nthe tests left files in the checkout {REPO}: {left[:20]!r}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if session.config.getoption("record_durations"):
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        known.update({k: round(v, 1) for k, v in _took.items()})
        DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")


@pytest.fixture(scope="session")
def dev_cluster(pytestconfig: pytest.Config) -> dict[str, str]:
    """The dev cluster, started if it is not running (and then stopped at the end of the session). Under
    pytest-xdist, each worker has a cluster of its own (helpers.cluster.worker_cluster), and so has the session of the
    short cluster tests (short_share_cluster)."""
    if pytestconfig.getoption("cluster_share") == "short":
        os.environ.update(short_share_cluster(dict(os.environ)))
    os.environ.update(worker_cluster(os.environ.get("PYTEST_XDIST_WORKER"), dict(os.environ)))
    started = subprocess.run([DEV_CLUSTER, "status"], capture_output=True).returncode != 0
    if started:
        up = subprocess.run([DEV_CLUSTER, "up"], capture_output=True, text=True)
        assert up.returncode == 0, f"scripts/dev-cluster up failed:\n{up.stdout}\n{up.stderr}"
    conf = subprocess.run([DEV_CLUSTER, "env"], capture_output=True, text=True, check=True).stdout
    slurm_conf = conf.strip().split("=", 1)[1]
    os.environ["SLURM_CONF"] = slurm_conf
    yield {"SLURM_CONF": slurm_conf}
    if started and not os.environ.get("HPCTRAIN_KEEP_CLUSTER"):
        subprocess.run([DEV_CLUSTER, "down"], capture_output=True)


@pytest.fixture(autouse=True)
def _cluster_for_slurm_tests(request: pytest.FixtureRequest) -> None:
    """Every test marked `slurm` has the dev cluster and SLURM_CONF, whichever test ran before it on its worker."""
    if request.node.get_closest_marker("slurm"):
        request.getfixturevalue("dev_cluster")


STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")


@pytest.fixture(autouse=True)
def _signal_handlers_put_back(request: pytest.FixtureRequest) -> None:
    """A test leaves the process's stop-signal handlers as it found them: one left behind would decide what a later
    test in the same process sees, so the suite's result would depend on its order."""
    before = {name: signal.getsignal(getattr(signal, name)) for name in STOP_SIGNALS}
    yield
    left = [name for name in STOP_SIGNALS if signal.getsignal(getattr(signal, name)) != before[name]]
    for name in left:
        signal.signal(getattr(signal, name), before[name])
    assert not left, f"{request.node.nodeid} left handlers for {', '.join(left)} installed"


@pytest.fixture(autouse=True)
def isolated_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test writes its own ledger file, never the user's; jobs it leaves behind are cancelled."""
    path = tmp_path / "ledger.db"
    monkeypatch.setenv("HPCTRAIN_LEDGER", str(path))
    yield path
    if path.exists():
        import sqlite3

        ids = [r[0] for r in sqlite3.connect(path).execute("SELECT slurm_job_id FROM jobs WHERE slurm_job_id IS NOT NULL")]
        if ids and "SLURM_CONF" in os.environ:
            subprocess.run(["scancel", *ids], capture_output=True)


@pytest.fixture
def slurm_calls(tmp_path: Path):
    """PATH wrappers that log every Slurm command run by hpctrain; returns (env, counts())."""
    from collections import Counter

    bin_dir, log = tmp_path / "shim-bin", tmp_path / "slurm-calls.log"
    bin_dir.mkdir()
    for cmd in SHIMMED:
        real = shutil.which(cmd)
        wrapper = bin_dir / cmd
        wrapper.write_text(f'#!/bin/bash\necho "{cmd}" >> {log}\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def counts() -> Counter:
        return Counter(log.read_text().split()) if log.exists() else Counter()

    return env, counts


@pytest.fixture
def no_slurm(tmp_path: Path) -> SlurmLog:
    """PATH stubs of every Slurm command that log it and fail without running it; returns (env, counts())."""
    return slurm_shims(tmp_path / "no-slurm")


# hpctrain as users install it (helpers.wheels): tests/unit/project/test_packaging.py and its cluster half.

@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the source: setuptools writes build/ and *.egg-info into the tree it builds, and the
    Slurm lanes' runs of this test (scripts/test) build from the same repository at the same time. The tools' caches
    and the run's shared folder (scripts/test's .test-run.*) stay out: other test processes write them meanwhile
    (hypothesis's .hypothesis/tmp, then a checkpoint's trash folder, came and went mid-copy)."""
    out, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source") / "hpctrain"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "results",
        "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache", ".test-run.*"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
                   check=True, capture_output=True)
    (built,) = out.glob("hpctrain-*.whl")
    return built


@pytest.fixture(scope="session")
def resolutions(wheel, tmp_path_factory) -> dict[str, dict[str, Resolution]]:
    """Per Python on this machine: pip resolving every extra claimed for it together ("claimed"; those that pull
    torch only where a local torch wheel lets them), and each extra that pulls no torch and is not claimed for it,
    alone (by its name). They all run at once, once a test run: under pytest-xdist the first worker to ask starts
    them (a file lock), in the run's shared folder, and every worker reads them (helpers.wheels.Resolution)."""
    out = run_folder(tmp_path_factory) / "resolve"
    local = PICK_PYTHON["local_torch_tags"]()
    extras = metadata(wheel).get_all("Provides-Extra")
    found: dict[str, dict[str, Resolution]] = {}
    for version in PYTHONS:
        python = interpreter(version)
        if python is None:
            continue
        torch = f"cp{version.replace('.', '')}" in local
        found[version] = {"claimed": Resolution(python, wheel, [e for e in extras if claimed(e, version) and (
            torch or e not in TORCH_EXTRAS)], out / f"{version}.json")}
        found[version].update({e: Resolution(python, wheel, [e], out / f"{version}-{e}.json") for e in extras
                               if not claimed(e, version) and e not in TORCH_EXTRAS})
    with exclusive_lock(out.with_suffix(".lock"), timeout_s=60):
        first = not out.exists()
        out.mkdir(exist_ok=True)
        started = [run.start() for runs in found.values() for run in runs.values()] if first else []
    yield found
    for proc in started:  # another worker may still read them: they end on their own
        proc.wait()


@pytest.fixture(scope="session", autouse=True)
def _resolutions_first(request) -> None:
    """Where this session has tests of the extras' resolutions, those start with the session's first test, to run
    beside the others (the tests that read them are quick and come late, in unit/project/)."""
    if any("resolutions" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("resolutions")


@pytest.fixture(scope="session", params=LOGIN_PYTHONS)
def login_install(request, wheel, tmp_path_factory) -> Path:
    """The wheel with its login-node dependencies only, in a venv of each Python: its bin directory."""
    python = interpreter(request.param)
    if python is None:
        pytest.skip(f"no Python {request.param} on this machine")
    return venv_with(python, tmp_path_factory.mktemp(f"venv{request.param}"), str(wheel))

