"""One job submitted to its K soonest placements at once (`hpctrain submit --race K`, issue 63): K runners in one
group, each with the same race file; the first to start claims it and runs the command, the others cancel
themselves before it (hpctrain.runtime.race) or are cancelled by the next poll (hpctrain.jobs.cancel)."""

from __future__ import annotations

import secrets
import time
from dataclasses import replace

from hpctrain.config.job import JobSpec
from hpctrain.config.loading import format_problems
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.submit.soonest import Ranking, as_submitted, from_now, refused
from hpctrain.submit.submitter import Submission, Submitter


def submit_race(
    submitter: Submitter, spec: JobSpec, where: str, ranking: Ranking, runners: int
) -> tuple[list[Submission], list[str]]:
    """Submit ``spec`` to the first ``runners`` candidates of ``ranking``; the submissions, and a line for each
    candidate whose submission failed once the first had gone (the race runs without it)."""
    if spec.array is not None:
        raise ConfigError(format_problems(where, [(("array",), "a race runs one job: an array cannot race")]))
    chosen = ranking.candidates[:runners]
    if not chosen:
        raise refused(ranking, where)
    race_dir = submitter.site.paths.logs / f"{spec.name}-race-{secrets.token_hex(4)}"
    race_dir.mkdir(parents=True)
    now = time.time()
    subs: list[Submission] = []
    left_out = []
    for c in chosen:
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
