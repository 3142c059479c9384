"""`hpctrain examples DIR` writes the examples below DIR and never through a symbolic link it finds there: a linked
folder is refused in one line, a linked file is kept as it is, and nothing is written where either points."""

from __future__ import annotations

from helpers.cli import run_cli


def test_examples_are_written_once_and_never_through_links(tmp_path):
    dest, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (dest / "scripts").mkdir(parents=True)
    (dest / "scripts" / "examples").symlink_to(elsewhere)
    refused = run_cli("examples", str(dest))
    assert refused.returncode == 2 and refused.stderr == (
        f"hpctrain: error: {dest / 'scripts' / 'examples'}: a symbolic link: not followed (hpctrain writes only "
        "into folders it made or found as folders)\n")
    assert list(elsewhere.iterdir()) == []

    (dest / "scripts" / "examples").unlink()
    (dest / "scripts" / "examples").mkdir()
    (dest / "scripts" / "examples" / "gpt-tiny.toml").symlink_to(elsewhere / "planted.toml")  # dangling
    done = run_cli("examples", str(dest))
    assert done.returncode == 0 and "1 already there (kept)" in done.stdout, done.stderr
    assert list(elsewhere.iterdir()) == [] and (dest / "scripts" / "examples" / "gpt-tiny.toml").is_symlink()
    again = run_cli("examples", str(dest))
    assert again.returncode == 0 and again.stdout.startswith(f"{dest / 'scripts' / 'examples'}: 0 file(s) written")
