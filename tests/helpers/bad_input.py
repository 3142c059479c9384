"""Bad input, generated, and text a user could type: what the tests of bad input share (tests/unit/config/
test_bad_spec.py and test_bad_site.py, tests/unit/cli/test_bad_cli_args.py and test_typed_input.py,
tests/unit/ledger/test_bad_ledger.py, tests/unit/checkpoint/test_bad_checkpoint.py, and their cluster halves in
tests/cluster/: test_bad_input_cluster.py, test_typed_input_cluster.py).

Every invalid input gives one error line per problem naming the file and the key (the CLI: exit 2,
each line "hpctrain: error: ...", or click's usage error; never a traceback) and loses nothing: no
Slurm command runs (the ``no_slurm`` fixture, `helpers.cluster.slurm_shims`), the ledger gets no row, and user
files keep their bytes. Most examples run in-process (``invoke``); a few go through `python -m hpctrain` as a
user would.
"""

from __future__ import annotations

import copy
import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, reject, settings
from hypothesis import strategies as st

from hpctrain.cli import cli
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table

from helpers.paths import ASSETS


def examples(n: int) -> settings:
    """``n`` examples, no deadline (the machine is shared), no example database left in the repo."""
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# Writing generated data as the files a user would write.

def toml_key(key: str) -> str:
    # json.dumps escapes like a TOML basic string, except DEL, which TOML wants escaped too.
    return json.dumps(key, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return toml_key(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def write_config(directory: Path, data: dict[str, Any], fmt: str) -> Path:
    """``data`` as <directory>/config.<fmt> (toml, json or yaml)."""
    if fmt == "yaml" and re.search("[\r\x85\u2028\u2029]", json.dumps(data, ensure_ascii=False)):
        reject()  # YAML reads these line breaks in plain keys as spaces: such data cannot be written
    path = directory / f"config.{fmt}"
    if fmt == "toml":
        path.write_text("".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in data.items()), encoding="utf-8")
    elif fmt == "json":
        path.write_text(json.dumps(data), encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def set_path(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def delete_path(data: dict[str, Any], path: tuple[str, ...]) -> None:
    node = data
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]


# Checking what came back.

def problem_lines(message: str, where: Path) -> list[str]:
    """The problem lines of a ConfigError, each checked to start with the file."""
    lines = message.splitlines()
    assert lines, "empty error message"
    for line in lines:
        assert line.startswith(f"{where}: "), f"does not start with the file: {line!r}"
    return [line[len(f"{where}: "):] for line in lines]


def dotted(key: tuple[str, ...]) -> str:
    """A key path as error lines write it: TOML's bare keys, others quoted (escaped where unprintable)."""
    return ".".join(k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k, ensure_ascii=not k.isprintable())
                    for k in key)


def names_key(line: str, key: tuple[str, ...]) -> bool:
    """Whether a problem line (file stripped) is about ``key`` or something inside it."""
    return re.match(re.escape(dotted(key)) + r"[:.\[]", line) is not None


def assert_names_keys(message: str, where: Path, keys: list[tuple[str, ...]]) -> None:
    """One line per problem: every line names one of ``keys``, every key is named."""
    lines = problem_lines(message, where)
    for line in lines:
        assert any(names_key(line, k) for k in keys), f"line names none of {keys}: {line!r}"
    for k in keys:
        assert any(names_key(line, k) for line in lines), f"{'.'.join(k)} not named in {lines}"


def assert_user_error(code: int, stderr: str) -> None:
    """Exit 2 and only 'hpctrain: error: ' lines (one per problem)."""
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert lines and all(line.startswith("hpctrain: error: ") for line in lines), stderr


def assert_rejected(code: int, stderr: str) -> None:
    """Exit 2 with exactly one error line: hpctrain's, or the 'Error:' line of click's usage message."""
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    if lines and lines[0].startswith("Usage: "):
        assert len([line for line in lines if line.startswith("Error: ")]) == 1, stderr
    else:
        assert len(lines) == 1 and lines[0].startswith("hpctrain: error: "), stderr


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """`hpctrain ARGS` in this process (fast); an exception other than exiting is a crash."""
    result = CliRunner().invoke(cli, list(args), prog_name="hpctrain", env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"crashed: {result.exception!r}\n{result.stderr}")
    return result


def assert_ledger_untouched(path: Path) -> None:
    """No ledger file, or one without jobs."""
    if path.exists():
        with Ledger(path) as ledger:
            assert Table(ledger, "jobs").rows() == []


# Job specs.

BASE_SPEC: dict[str, Any] = {
    "name": "gpt-tiny",
    "command": ["python", "-m", "hpctrain.train"],
    "workdir": "/tmp",
    "seed": 3,
    "launcher": "srun",
    "requeue": True,
    "resources": {"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1, "mem": "1G", "time": "00:05:00",
                  "partition": "gpu", "account": "teamb", "qos": "normal", "preemptible": False},
    "parallel": {"dp": 2, "tp": 2, "micro_batch": 2, "grad_accum": 2, "global_batch": 8, "zero_stage": 1,
                 "precision": "bf16"},
    "model": {"layers": 4, "heads": 4, "hidden": 64, "vocab": 256, "seq_len": 64},
    "data": {"index": "/tmp/index.json", "workers": 2, "shuffle_buffer": 100, "max_quarantined_fraction": 0.1},
    "checkpoint": {"dir": "/tmp/ck", "every_steps": 10, "keep_last": 2, "async": True},
    "hyperparameters": {"lr": 3e-4},
    "env": {"GREETING": "hi", "TOKEN": {"secret": True}},
    "retry": {"on_error": False, "max_stalled_attempts": 3},
    "array": {"grid": {"lr": [0.1, 0.01]}, "throttle": 2},
    "dependency": {"after": ["1234", "1234_5"], "kind": "afterok", "singleton": False},
}
SPEC_BASES = [BASE_SPEC] + [tomllib.loads(p.read_text()) for p in sorted((ASSETS / "specs").glob("*.toml"))]

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
# None is left out where a missing value is allowed; TOML has no null, YAML and JSON do.
not_int = st.one_of(st.text(max_size=8), st.floats(), st.booleans(),
                    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
not_bool = st.one_of(st.text(max_size=5), st.integers(), st.floats(), st.lists(st.booleans(), max_size=2))
not_str = st.one_of(st.integers(), st.floats(), st.booleans(), st.lists(st.text(max_size=3), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2))
not_table = st.one_of(st.integers(), st.floats(), st.booleans(), st.text(max_size=5), st.lists(st.integers(), max_size=2))


def below(limit: int) -> st.SearchStrategy[Any]:
    return st.one_of(not_int, st.integers(max_value=limit - 1))


HUGE = 10**30
SHELL = ["a b;rm -rf ~", "x\n#SBATCH --exclusive", "$(reboot)", "`id`", "a|b", "a&b", "a>b", "'quoted'", '"dq"',
         "tab\tsep", "new\nline", "trailing\n", "", " ", "-dash", ".dot", "_under", "naïve", "日本", "a/b", "a\\b",
         "a\x00b", "a\u2028b", "#SBATCH"]
bad_slurm_name = st.one_of(
    not_str,
    st.one_of(st.sampled_from(SHELL), st.text(min_size=1, max_size=10)).filter(
        lambda s: not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", s)))
bad_job_name = st.one_of(bad_slurm_name, st.integers(65, 200).map(lambda n: "a" * n))
bad_env_name = st.one_of(st.sampled_from(SHELL + ["1ABC", "A-B", "A.B", "A\n"]), st.text(min_size=1, max_size=8)).filter(
    lambda s: not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s))
bad_time = st.one_of(
    st.sampled_from(["1:99:99", "25h", "-1", "0", "00:00:00", "1-24:00:00", "00:60", "00:30:60", "1:2:3:4", "1-",
                     "-1-00", "1.5", "", "forever", "UNLIMITED", "٣٠", "１０", "1e3", "10 x", "01:00:00 x"]),
    st.builds("{}:{:02d}:{:02d}".format, st.integers(0, 99), st.integers(60, 999), st.integers(0, 59)),
    st.builds("{}:{:02d}:{:02d}".format, st.integers(0, 99), st.integers(0, 59), st.integers(60, 999)),
    st.builds("{}-{:02d}".format, st.integers(0, 9), st.integers(24, 99)),
    st.builds("{}-{:02d}:{:02d}".format, st.integers(0, 9), st.integers(0, 23), st.integers(60, 99)),
    st.integers(max_value=0), st.floats(), st.booleans(),
    # a list of time limits, longest first, is the run's and the shorter ones it may go in (`time_chunks`)
    st.lists(st.integers(), max_size=2).filter(lambda v: not (len(v) == 2 and v[0] > v[1] > 0)),
)
bad_mem = st.one_of(
    st.sampled_from(["12XB", "-1", "0", "0G", "1K", "1.5G", "16 G", "G", "", "١٦G", "16GiB", "lots", "1e3", "16P"]),
    st.builds("{}{}".format, st.integers(0, 10**6), st.sampled_from(["XB", "P", "KiB", "GG", "g b", "M M", "E"])),
    st.integers(max_value=0).map(str), st.integers(max_value=0), st.floats(), st.booleans(),
)
bad_positive = st.one_of(st.floats(max_value=0), st.just(math.inf), st.just(math.nan), st.text(max_size=4), st.booleans())
bad_fraction = st.one_of(st.floats(min_value=1, exclude_min=True), st.floats(max_value=0, exclude_max=True),
                         st.just(math.nan), st.text(max_size=4), st.booleans())
bad_mode = st.one_of(not_int, st.integers(max_value=-1), st.integers(min_value=0o1000))
bad_path = st.one_of(st.just(""), st.just("a\x00b"), st.integers(), st.booleans(), st.lists(st.text(max_size=3), max_size=2))
# Read as an option by the program it is given to (srun, apptainer, cd, exec).
dash = st.text(max_size=6).map(lambda s: "-" + s)
bad_command = st.one_of(
    st.just([]), st.sampled_from([[""], [" "], ["\t", "train.py"]]), st.text(max_size=10),
    st.tuples(dash, st.lists(st.text(max_size=4), max_size=2)).map(lambda t: [t[0], *t[1]]),
    st.lists(st.one_of(st.integers(), st.floats(), st.booleans()), min_size=1, max_size=3),
    st.lists(st.text(max_size=4), min_size=1, max_size=3).flatmap(
        lambda argv: st.integers(0, len(argv)).map(lambda i: argv[:i] + [7] + argv[i:])),
)


# Shell commands that are not complete: each would swallow the batch script's lines after it.
UNBALANCED = ["echo 'a", 'echo "a', "echo $(date", "echo ${HOME", "echo `date", "if true; then", "for i in 1; do",
              "while :; do", "case x in", "{ echo a", "( cd /", "cat <<EOF", "echo a \\", "echo a &&", "echo a |",
              "f() {"]
bad_setup = st.tuples(st.lists(st.sampled_from(["module load gcc", "export A=1", "source env.sh"]), max_size=2),
                      st.sampled_from(["", "export A=1; "]), st.sampled_from(UNBALANCED), st.integers(0, 2)).map(
    lambda t: [*t[0][:t[3]], t[1] + t[2], *t[0][t[3]:]])
# Path fields expand $NAME from the submitting environment: never a secret's (BASE_SPEC's TOKEN).
SECRET_PATH_FIELDS = [("workdir",), ("data", "index"), ("checkpoint", "dir"), ("container", "workdir")]
secret_path = st.sampled_from(["$TOKEN", "${TOKEN}", "/scratch/$TOKEN/run", "${TOKEN:-/tmp}", "~/$TOKEN", "$HOME$TOKEN"])


def literal_other(*allowed: str) -> st.SearchStrategy[Any]:
    return st.one_of(not_str, st.text(max_size=8).filter(lambda s: s not in allowed))



def known_keys(model: type) -> set[str]:
    return {n for name, f in model.model_fields.items() for n in (name, f.alias) if n}


GOOD_SPEC = 'name = "ok"\ncommand = ["true"]\nlauncher = "none"\n[resources]\ntime = "00:01:00"\nmem = "100M"\n'


# Text a user could type (tests/unit/cli/test_typed_input.py and tests/cluster/test_typed_input_cluster.py).

ONE_LINER = "print(" + " + ".join(["'x'"] * 80) + ")"  # 400 characters: longer than a file name may be


def spec_file(tmp_path: Path, body: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def one_error_line(done, *needles: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("hpctrain: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and all(n in done.stderr for n in needles), done.stderr


def string_leaves(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths to every string in ``data`` (dict keys and list indexes)."""
    if isinstance(data, str):
        return [prefix]
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    return [p for k, v in items for p in string_leaves(v, (*prefix, k))]


def with_value(data: dict[str, Any], path: tuple, value: str) -> dict[str, Any]:
    data = copy.deepcopy(data)
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return data


typed_text = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=12),  # NUL, CR, line and paragraph separators, non-ASCII
    st.sampled_from(SHELL),
    st.integers(256, 5000).map(lambda n: "é" * n),
)


# Hostile text (issue 57's payload families), for the commands and spec fields of the post-training layer.
LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # every break str.splitlines() knows, cron's own first
word = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=6)
hostile_text = st.one_of(
    st.tuples(word, st.sampled_from(LINE_BREAKS), st.sampled_from(["* * * * * touch /tmp/m #", "MAILTO=x", "x"])).map(
        "".join),  # line breaks, what follows one a cron entry of its own
    st.sampled_from(["[/]", "[bold]b[/bold]", "[link=http://x]l[/link]", ":smile:", "[red", "\\[x]"]),  # rich markup
    st.sampled_from(["$x^2$", "$\\frac{a}{$", "$$", "a$b$c", "$\\undefined$"]),  # matplotlib mathtext
    st.one_of(st.text(st.characters(categories=["Cc"]), min_size=1, max_size=4),  # control characters, escapes
              st.sampled_from(["\x1b]0;title\x07", "\x1b[2J", "\x9b1m", "\x00"])).map(lambda s: f"a{s}b"),
    st.sampled_from(["\udcff", "a\udc80b", "\ud800"]),  # non-UTF-8 bytes (as surrogateescape reads them), surrogates
    st.integers(1_000, 300_000).map(lambda n: "x" * n),  # huge
)
