import subprocess
import sys

from hpctrain import __version__

from helpers.cli import run_cli

HEAVY = ("torch", "deepspeed", "tensorstore", "webdataset", "zarr", "numpy")


def test_version_command():
    out = run_cli("version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"hpctrain {__version__}"


def test_help_lists_commands_and_loads_no_heavy_library():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from hpctrain.cli import cli\n"
        "r = CliRunner().invoke(cli, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(r.output)\n"
        f"print('HEAVY:', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "doctor" in out and "version" in out
    assert "HEAVY: []" in out


def test_user_error_is_one_line_without_traceback(tmp_path):
    out = run_cli("doctor", "--site", str(tmp_path / "missing.toml"))
    assert out.returncode == 2
    assert out.stderr == f"hpctrain: error: {tmp_path / 'missing.toml'}: site config file not found\n"


def test_unknown_site_name_names_search_path():
    out = run_cli("doctor", "--site", "no-such-cluster")
    assert out.returncode == 2
    assert out.stderr.startswith("hpctrain: error: site 'no-such-cluster' not found (searched ")
    assert "Traceback" not in out.stderr
