"""Bad site configs, generated: every field with values it must refuse, keys it does not know, sections it needs
left out, partition, QOS and variable names that cannot go into a script; each is one error line naming the file
and the key, and the CLI refuses it before any Slurm command runs (helpers.bad_input)."""

from __future__ import annotations

import copy
import math
import tomllib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctrain.config import load_site, site
from hpctrain.errors import ConfigError

from helpers.bad_input import (assert_names_keys, assert_user_error, bad_env_name, bad_fraction, bad_mem, bad_mode,
                               bad_path, bad_positive, bad_setup, bad_slurm_name, bad_time, below, dash, delete_path,
                               examples, known_keys, literal_other, not_bool, not_str, not_table, scalars, set_path,
                               write_config)
from helpers.cli import run_cli
from helpers.paths import REPO

pytestmark = pytest.mark.timeout(180)  # a hang fails with its stack instead of holding the shared machine


DEV_SITE = tomllib.loads((REPO / "site_configs" / "dev.toml").read_text())

SITE_FIELDS: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("name",): bad_slurm_name,
    ("description",): not_str,
    ("setup",): st.one_of(st.text(max_size=5), st.lists(st.integers(), min_size=1, max_size=2), bad_setup),
    ("containers", "apptainer"): dash,
    ("containers", "python"): dash,
    ("accounts",): st.one_of(st.just([]), not_table.filter(lambda v: not isinstance(v, list)),
                             st.lists(bad_slurm_name, min_size=1, max_size=2)),
    ("slurm", "conf"): bad_path,
    ("slurm", "timeout_s"): bad_positive,
    ("slurm", "max_array_size"): below(1),
    ("defaults", "account"): st.one_of(bad_slurm_name, st.just("teamc")),
    ("defaults", "partition"): st.one_of(bad_slurm_name, st.just("cpu")),
    ("defaults", "qos"): st.one_of(bad_slurm_name, st.just("urgent")),
    ("defaults", "preemptible_qos"): st.one_of(bad_slurm_name, st.sampled_from(["normal", "urgent"])),
    ("defaults", "time"): bad_time,
    ("defaults", "signal_lead_s"): below(10),
    ("partitions", "gpu", "gpus_per_node"): below(0),
    ("partitions", "gpu", "cpus_per_node"): below(1),
    ("partitions", "gpu", "mem_per_node"): bad_mem,
    ("partitions", "gpu", "nodes"): below(1),
    ("partitions", "gpu", "max_time"): bad_time,
    ("partitions", "gpu", "gpu_type"): bad_slurm_name,
    ("partitions", "gpu", "gpu_request"): literal_other("gpus-per-node", "gres"),
    ("qos", "low", "preemptible"): not_bool,
    ("qos", "high", "preempts"): st.one_of(st.text(max_size=3), st.lists(st.just("lowest"), min_size=1, max_size=1)),
    ("qos", "normal", "description"): not_str,
    ("paths", "data"): bad_path,
    ("paths", "logs"): bad_path,
    ("ledger", "path"): bad_path,
    ("ledger", "mode"): bad_mode,
    ("checkpoint", "mode"): bad_mode,
    ("network_env", "OMP_NUM_THREADS"): not_str,
    ("gpu_hour_price", "gpu"): st.one_of(st.text(max_size=3), st.booleans(), st.just(math.inf), st.just(math.nan)),
    ("gpu_hour_price", "cpu"): st.floats(0, 10),  # no such partition
    ("launch", "python"): st.one_of(bad_path, dash),
    ("launch", "master_port_range"): st.one_of(
        st.just([29999, 21000]), st.just([80, 90]), st.just([21000, 70000]), st.just([1, 2, 3]), st.text(max_size=3),
        st.tuples(st.integers(1024, 65535), st.integers(1024, 65535)).filter(lambda t: t[0] >= t[1]).map(list)),
    ("alerts", "stall_minutes"): bad_positive,
    ("alerts", "data_wait_fraction"): st.one_of(bad_fraction, st.just(0.0)),
    ("templates_dir",): bad_path,
    **{(section,): not_table for section in ("slurm", "defaults", "partitions", "qos", "paths", "ledger",
                                              "checkpoint", "network_env", "gpu_hour_price", "launch", "alerts")},
    ("partitions", "gpu"): not_table,
}
SITE_REQUIRED = [("name",), ("defaults",), ("partitions",), ("accounts",), ("qos",), ("paths",),
                 ("defaults", "partition"), ("partitions", "gpu", "cpus_per_node"),
                 ("partitions", "debug", "mem_per_node"), ("paths", "logs")]
SITE_SECTIONS: dict[tuple[str, ...], type] = {
    (): site.SiteConfig, ("slurm",): site.SlurmAccess, ("defaults",): site.Defaults, ("partitions", "gpu"): site.Partition,
    ("qos", "low"): site.Qos, ("paths",): site.Paths, ("ledger",): site.LedgerConfig,
    ("checkpoint",): site.CheckpointConfig, ("launch",): site.Launch, ("alerts",): site.Alerts,
}


@st.composite
def site_mutation(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[str, ...]]]:
    """The dev site with one thing wrong: (site, [the key path to be named])."""
    cfg = copy.deepcopy(DEV_SITE)
    kind = draw(st.sampled_from(["field", "field", "field", "unknown", "missing", "name"]))
    if kind == "field":
        path = draw(st.sampled_from(sorted(SITE_FIELDS)))
        set_path(cfg, path, draw(SITE_FIELDS[path]))
        return cfg, [path]
    if kind == "unknown":
        section = draw(st.sampled_from(sorted(SITE_SECTIONS)))
        key = draw(st.text(min_size=1, max_size=10).filter(lambda k: k not in known_keys(SITE_SECTIONS[section])))
        set_path(cfg, section + (key,), draw(scalars.filter(lambda v: v is not None)))
        return cfg, [section + (key,)]
    if kind == "missing":
        path = draw(st.sampled_from(SITE_REQUIRED))
        delete_path(cfg, path)
        return cfg, [path]
    # A partition, QOS or network variable whose name cannot go into a script.
    section = draw(st.sampled_from(["partitions", "qos", "network_env"]))
    name = draw(bad_env_name if section == "network_env" else bad_slurm_name.filter(lambda n: isinstance(n, str)))
    cfg[section][name] = {"network_env": "x", "qos": {}}.get(section, copy.deepcopy(cfg["partitions"]["gpu"]))
    return cfg, [(section, name)]


@examples(250)
@given(case=site_mutation(), fmt=st.sampled_from(["toml", "yaml"]))
def test_invalid_site_config_names_file_and_key(tmp_path, case, fmt):
    site, keys = case
    path = write_config(tmp_path, site, fmt)
    with pytest.raises(ConfigError) as info:
        load_site(str(path))
    assert_names_keys(str(info.value), path, keys)


def test_dev_site_is_valid_as_written(tmp_path):
    for fmt in ("toml", "yaml"):
        assert load_site(str(write_config(tmp_path, DEV_SITE, fmt))).partitions["gpu"].nodes == 3


@examples(3)
@given(case=site_mutation())
def test_cli_refuses_an_invalid_site_config(tmp_path, isolated_ledger, no_slurm, case):
    env, calls = no_slurm
    path = write_config(tmp_path, case[0], "toml")
    out = run_cli("status", "--site", str(path), "--no-refresh", env=env)
    assert_user_error(out.returncode, out.stderr)
    assert all(line.startswith(f"hpctrain: error: {path}: ") for line in out.stderr.splitlines())
    assert calls() == {}
    assert not isolated_ledger.exists()
