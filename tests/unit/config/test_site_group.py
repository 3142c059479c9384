"""Site groups: several clusters named as one `--site` (hpctrain.config.site.SiteGroup), for the commands that span
clusters (where, submit --soonest, status, cost); a command of one site refuses a group in one line."""

from __future__ import annotations

import json

import pytest

from hpctrain.config import load_site
from hpctrain.config.site import site_names
from hpctrain.errors import ConfigError

from helpers.bad_input import assert_ledger_untouched, assert_rejected
from helpers.cli import run_cli
from helpers.paths import REPO


@pytest.fixture
def sites(tmp_path, monkeypatch):
    """Site c2 (the dev site renamed) in a folder on the search path, and groups there: `both` (dev by name, c2
    by a path relative to the group's file), `nested` (a group in a group), `alone` (one site)."""
    folder = tmp_path / "sites"
    (folder / "more").mkdir(parents=True)
    dev = (REPO / "site_configs" / "dev.toml").read_text()
    (folder / "more" / "c2.toml").write_text(dev.replace('name = "dev"', 'name = "c2"', 1))
    (folder / "both.toml").write_text('sites = ["dev", "more/c2.toml"]\n')
    (folder / "nested.yaml").write_text("sites: [both, dev]\n")
    (folder / "alone.toml").write_text('sites = ["dev"]\n')
    monkeypatch.setenv("HPCTRAIN_SITE_DIR", str(folder))
    return folder


def test_a_group_names_its_sites_each_once_in_order(sites):
    c2 = str(sites / "more" / "c2.toml")
    assert site_names("both") == ["dev", c2]
    assert site_names("dev,both") == ["dev", c2]
    assert site_names(f"{c2},both") == [c2, "dev"]
    assert site_names("dev") == ["dev"]
    assert [load_site(name).name for name in site_names("both")] == ["dev", "c2"]


@pytest.mark.parametrize(("site", "said"), [
    ("nested", "nested.yaml: sites: both is a group of sites itself"),
    ("alone", "alone.toml: sites: expected at least 2 item(s)"),
    ("dev,nosuch", "site 'nosuch' not found"),
])
def test_a_bad_group_is_one_line_naming_its_file(sites, site, said):
    with pytest.raises(ConfigError) as exc:
        site_names(site)
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_a_command_of_one_site_refuses_a_group_and_those_of_several_take_it(sites, tmp_path, isolated_ledger,
                                                                             no_slurm):
    env, calls = no_slurm
    with pytest.raises(ConfigError, match="both.toml: a group of sites, where this command takes one"):
        load_site("both")
    spec = tmp_path / "ok.toml"
    spec.write_text('name = "a"\ncommand = ["true"]\n')
    for args, said in ((("show", "1"), "a group of sites"), (("submit", str(spec)), "several clusters")):
        refused = run_cli(*args, "--site", "both", env=env)
        assert_rejected(refused.returncode, refused.stderr)
        assert calls() == {} and said in refused.stderr
    assert_ledger_untouched(isolated_ledger)
    shown = run_cli("status", "--no-refresh", "--site", "both", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == [] and calls() == {}
