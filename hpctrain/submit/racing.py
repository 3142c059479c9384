"""One job submitted to its K soonest placements at once (`hpctrain submit --race K`, issue 63): K runners in one
group, each with the same race file; the first to start claims it and runs the command, the others cancel
themselves before it (hpctrain.runtime.race) or are cancelled by the next poll of their cluster
(hpctrain.jobs.cancel). Runners on several clusters race through a logs folder they all name: the race file is in
it."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import replace

from hpctrain.config.job import JobSpec
from hpctrain.config.loading import format_problems
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.submit.soonest import Ranking, as_submitted, from_now, refused
from hpctrain.submit.submitter import Submission, Submitter


def submit_race(
    submitters: Sequence[Submitter], spec: JobSpec, where: str, ranking: Ranking, runners: int
) -> tuple[list[Submission], list[str]]:
    """Submit ``spec`` to the first ``runners`` candidates of ``ranking``, each through the submitter of its site
    (the first's where a candidate names none); the submissions, and a line for each candidate whose submission
    failed once the first had gone (the race runs without it)."""
    if spec.array is not None:
        raise ConfigError(format_problems(where, [(("array",), "a race runs one job: an array cannot race")]))
    chosen = ranking.candidates[:runners]
    if not chosen:
        raise refused(ranking, where)
    by_site = {s.site.name: s for s in submitters}
    placed = [(c, by_site[c.placement.site or submitters[0].site.name]) for c in chosen]
    logs = {s.site.paths.logs: s.site.name for _, s in placed}
    if len(logs) > 1:
        said = ", ".join(f"site {name}'s is {path}" for path, name in logs.items())
        raise ConfigError(f"{where}: a race across clusters needs one logs folder they all see ([paths] logs): {said}")
    race_dir = next(iter(logs)) / f"{spec.name}-race-{secrets.token_hex(4)}"
    race_dir.mkdir(parents=True)
    now = time.time()
    subs: list[Submission] = []
    left_out = []
    for c, submitter in placed:
        others = ", ".join(o.name for o in chosen if o is not c)
        placement = replace(
            c.placement,
            reason=f"race: {c.name} {from_now(c.start, now)} ({c.basis}), against {others}",
            starts=(c.start, c.slurm_start),
        )
        try:
            subs.append(
                submitter.submit(
                    as_submitted(spec, placement, submitter.site),
                    where,
                    placement=placement,
                    race_file=race_dir / "race",
                    group_id=subs[0].group_id if subs else None,
                )
            )
        except HpctrainError as exc:
            if not subs:
                raise
            left_out.append(f"{c.name}: {exc}")
    return subs, left_out
