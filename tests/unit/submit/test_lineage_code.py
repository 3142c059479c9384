"""Issue 56.12: the code a job ran, as lineage records it from a real git repository: a training script git does not
track makes the checkout dirty, and its content is in the recorded hash (`show --lineage` sees it edited)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpctrain.submit.lineage import code_state


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A repository with one commit: README, a .gitignore of *.log, src/train.py."""
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "README").write_text("hello\n")
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "src" / "train.py").write_text("print('train')\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    return repo


def test_a_clean_checkout_is_clean_and_an_ignored_file_keeps_it_so(repo):
    (repo / "src" / "run.log").write_text("ignored\n")
    state = code_state(repo / "src" / "train.py")
    assert (state["dirty"], state["diff_sha256"], state["repo"]) == (False, None, str(repo))


def test_an_untracked_training_script_is_dirty_and_its_edits_change_the_hash(repo):
    script = repo / "src" / "new_train.py"
    script.write_text("print('v1')\n")
    first = code_state(script)
    assert first["dirty"] is True and first["diff_sha256"]
    script.write_text("print('v2')\n")
    assert code_state(script)["diff_sha256"] != first["diff_sha256"]


def test_an_untracked_file_elsewhere_in_the_repository_makes_it_dirty(repo):
    (repo / "helpers.py").write_text("x = 1\n")  # above the entry point's folder
    assert code_state(repo / "src" / "train.py")["dirty"] is True


def test_a_tracked_edit_is_hashed_as_before(repo):
    """A checkout with tracked changes only records the hash of `git diff HEAD`, as jobs recorded it so far."""
    import hashlib

    (repo / "src" / "train.py").write_text("print('changed')\n")
    diff = subprocess.run(["git", "-C", str(repo), "diff", "HEAD"], capture_output=True, check=True).stdout
    state = code_state(repo / "src" / "train.py")
    assert state["dirty"] is True and state["diff_sha256"] == hashlib.sha256(diff).hexdigest()
