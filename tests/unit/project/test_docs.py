"""The docs a newcomer reads hold together: every relative link in README.md, CONTRIBUTING.md, tests/README.md
and docs/*.md reaches a file (and a heading, where it names one), and every `hpctrain ...` command they show, in a
code block or inline, names a command that exists (resolved through click's groups as the CLI resolves it),
with options it has, and answers --help. No cluster, no subprocess: click's CliRunner."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import click
import pytest
from click.testing import CliRunner

from hpctrain.cli import cli

from helpers.paths import REPO


def pages() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "tests" / "README.md",
            *sorted((REPO / "docs").glob("*.md"))]


# --- Markdown, as GitHub reads it (the parts these checks need) -------------------------------------------------

FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r" {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


class Markdown:
    """A page's headings, fenced code lines and prose paragraphs, each with its line number."""

    def __init__(self, text: str):
        self.text = text
        self.headings: list[str] = []
        self.code: list[tuple[int, str]] = []
        self.paragraphs: list[tuple[int, str]] = []
        fence, start, lines = "", 0, []

        def flush() -> None:
            if lines:
                self.paragraphs.append((start, "\n".join(lines)))
                lines.clear()

        for number, line in enumerate(text.splitlines(), 1):
            opening = FENCE.match(line)
            if fence:
                if opening and opening[1][0] == fence[0] and len(opening[1]) >= len(fence) \
                        and not line[opening.end():].strip():
                    fence = ""
                else:
                    self.code.append((number, line))
                continue
            if opening:
                flush()
                fence = opening[1]
            elif not line.strip():
                flush()
            elif heading := HEADING.match(line):
                flush()
                self.headings.append(heading[2])
                self.paragraphs.append((number, heading[2]))
            else:
                if not lines:
                    start = number
                lines.append(line)
        flush()

    def spans(self) -> list[tuple[int, str]]:
        """Inline code spans (a span may run over a line break; `\\|` in a table cell is a `|`)."""
        return [(number, " ".join(m[2].replace("\\|", "|").split()))
                for number, paragraph in self.paragraphs for m in CODE_SPAN.finditer(paragraph)]

    def link_targets(self) -> list[tuple[int, str]]:
        found = []
        for number, paragraph in self.paragraphs:
            prose = CODE_SPAN.sub("code", paragraph)
            found += [(number, m[1]) for m in LINK.finditer(prose)]
            found += [(number, m[1]) for m in REFERENCE.finditer(prose)]
        return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a page: its headings' (a repeated one gets -1, -2, ... as on GitHub) and HTML ones."""
    text = page.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    found = set(HTML_ANCHOR.findall(text))
    for heading in Markdown(text).headings:
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


# --- the checks ---------------------------------------------------------------------------------------------------

def link_problems(page: Path, root: Path = REPO) -> list[str]:
    """Relative links of ``page`` that reach no file inside ``root``, or no heading of the page they name."""
    problems = []
    for number, target in Markdown(page.read_text(encoding="utf-8")).link_targets():
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//"):
            continue  # http(s)://, mailto: ...: not this check's
        where = f"{page.relative_to(root)}:{number}: ({target})"
        path, _, fragment = unquote(target).partition("#")
        if not path and not fragment:
            problems.append(f"{where}: an empty link")
            continue
        dest = (root / path.lstrip("/") if path.startswith("/") else page.parent / path).resolve() if path else page
        if not dest.is_relative_to(root.resolve()):
            problems.append(f"{where}: leaves the repository")
        elif not dest.exists():
            problems.append(f"{where}: no such file {dest.relative_to(root.resolve())}")
        elif fragment and dest.suffix == ".md":
            if fragment not in anchors(dest):
                problems.append(f"{where}: no heading #{fragment} in {dest.relative_to(root.resolve())}")
        elif fragment and not re.fullmatch(r"L\d+(-L\d+)?", fragment):
            problems.append(f"{where}: #{fragment} is no anchor of a file that is not Markdown")
    return problems


CALL = re.compile(r"(?:[\w.~-]*/)*hpctrain(?=[ \t])")
# What may come right before a command: nothing, a prompt or substitution, a shell operator, `python -m`.
COMMAND_POSITION = ("$", ";", "&&", "||", "|", "(", "`", "-m", "exec", "sudo", "then", "do")
WORD = re.compile(r"[a-z][a-z0-9_-]*(?:\|[a-z][a-z0-9_-]*)*")
OPTION = re.compile(r"--?[A-Za-z][\w-]*")


def calls(code: str) -> list[list[str]]:
    """The words after each `hpctrain` that stands where a shell runs a command, up to a comment or operator."""
    found = []
    for m in CALL.finditer(code):
        before = code[:m.start()]
        if before and not before[-1].isspace() and before[-1] not in ";&|(`$":
            continue
        if before.strip() and not before.rstrip().endswith(COMMAND_POSITION):
            continue
        tokens = []
        for token in code[m.end():].split():
            if token.startswith("#") or token in (";", "&&", "||", "|", ">", ">>", "--"):
                break
            last = token.endswith((")", ";", "`"))
            tokens.append(token.rstrip(");`"))
            if last:
                break
        found.append(tokens)
    return found


def options_of(command: click.Command, ctx: click.Context) -> set[str]:
    names = {"-h", "--help"}
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            names.update(param.opts, param.secondary_opts)
    return names


def command_problems(tokens: list[str], helped: dict[tuple[str, ...], int]) -> list[str]:
    """What is wrong with `hpctrain TOKENS`: a word that names no subcommand of its group, an option the command
    lacks, a command whose --help fails. ``ls|verify`` stands for each of its alternatives."""
    shown = " ".join(["hpctrain", *tokens])
    root = click.Context(cli, info_name="hpctrain")
    current: list[tuple[list[str], click.Command, click.Context]] = [([], cli, root)]
    rest = list(tokens)
    while rest and all(isinstance(c, click.Group) for _, c, _ in current) and WORD.fullmatch(rest[0]):
        word = rest.pop(0)
        following = []
        for path, group, ctx in current:
            for name in word.split("|"):
                sub = group.get_command(ctx, name)  # type: ignore[union-attr]
                if sub is None:
                    return [f"`{shown}`: `{' '.join(['hpctrain', *path])}` has no command {name!r}"]
                following.append(([*path, name], sub, click.Context(sub, info_name=name, parent=ctx)))
        current = following
    problems = []
    for token in rest:
        option = OPTION.match(token.strip("[]()'\",."))
        if option:
            for path, command, ctx in current:
                if option[0] not in options_of(command, ctx):
                    problems.append(f"`{shown}`: `hpctrain {' '.join(path)}` has no option {option[0]}")
    for path, _, _ in current:
        key = tuple(path)
        if key not in helped:
            helped[key] = CliRunner().invoke(cli, [*path, "--help"], prog_name="hpctrain").exit_code
        if helped[key] != 0:
            problems.append(f"`{shown}`: `hpctrain {' '.join(path)} --help` exits {helped[key]}")
    return problems


def page_command_problems(page: Path, helped: dict[tuple[str, ...], int], root: Path = REPO) -> list[str]:
    md = Markdown(page.read_text(encoding="utf-8"))
    problems = []
    for number, code in [*md.code, *md.spans()]:
        for tokens in calls(code):
            problems += [f"{page.relative_to(root)}:{number}: {p}" for p in command_problems(tokens, helped)]
    return problems


# --- the tests ----------------------------------------------------------------------------------------------------

def test_the_pages_are_there():
    assert all(p.is_file() for p in pages())
    assert len(pages()) >= 12  # the README, CONTRIBUTING, tests/README and docs/ (an index and a page per topic)


def test_every_relative_link_reaches_a_file_and_its_heading():
    checked = [(page, target) for page in pages() for target in Markdown(page.read_text()).link_targets()]
    assert len(checked) > 50  # the parser finds the links
    assert [p for page in pages() for p in link_problems(page)] == []


def test_every_command_shown_exists_with_its_options_and_answers_help():
    helped: dict[tuple[str, ...], int] = {}
    problems = [p for page in pages() for p in page_command_problems(page, helped)]
    assert problems == []
    assert len(helped) > 25  # the scan sees the commands: most of the CLI is shown somewhere


@pytest.mark.parametrize("heading, anchor", [
    ("Installing elsewhere", "installing-elsewhere"),
    ("On the cluster's bad days", "on-the-clusters-bad-days"),
    ("Python functions (submitit)", "python-functions-submitit"),
    ("Shards elsewhere: files, `pipe:` and http(s)", "shards-elsewhere-files-pipe-and-https"),
    ("The [ledger](ledger.md) and `run_usage`", "the-ledger-and-run_usage"),
])
def test_anchors_follow_githubs_rules(heading, anchor):
    assert slug(heading) == anchor


def test_the_checks_find_a_broken_link_a_missing_heading_and_a_renamed_command(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "other.md").write_text("# Other\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\nFine: [a](../other.md#twice-1), [b](#page), [c](https://example.org/x), `[not](a-link.md)`.\n"
        "Broken: [d](../missing.md), [e](../other.md#three), [f](#nowhere), [g](../../outside.md).\n\n"
        "```bash\nhpctrain sweep tick   # hpctrain nothing here\n(crontab -l; hpctrain sweep cron) | crontab -\n"
        "hpctrain sweep tock\nhpctrain status --all --watched\n```\n\n"
        "Inline: `hpctrain ckpt ls|verify|inspect`, `hpctrain ckpt ls|check`, `hpctrain.integrations.hf`,\n"
        "`python -m hpctrain sweep tick`, `hpctrain launch -- python train.py --lr 3`, `hpctrain nosuch JOB`.\n")
    links = link_problems(page, tmp_path)
    assert [p.split(": (")[1].split(")")[0] for p in links] == [
        "../missing.md", "../other.md#three", "#nowhere", "../../outside.md"]
    helped: dict[tuple[str, ...], int] = {}
    problems = page_command_problems(page, helped, tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "`hpctrain sweep tock`: `hpctrain sweep` has no command 'tock'",
        "`hpctrain status --all --watched`: `hpctrain status` has no option --watched",
        "`hpctrain ckpt ls|check`: `hpctrain ckpt` has no command 'check'",
        "`hpctrain nosuch JOB`: `hpctrain` has no command 'nosuch'",
    ]
    assert {("sweep", "tick"), ("sweep", "cron"), ("ckpt", "inspect"), ("launch",)} <= set(helped)
