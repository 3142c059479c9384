"""The policies a site config and a job spec share: when a rank counts as hung ([hang]) and when a GPU counts as idle
([idle]). Apart from the job spec, so that commands reading only the site config do not build the spec's models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, FiniteFloat

from hpctrain.config.loading import StrictModel

MAX_TIMEOUT_S = 30 * 86400  # a longer timeout is a mistake (and one of centuries overflows the clocks that arm it)


class HangPolicy(StrictModel):
    """How long each phase of a rank may go without progress before it counts as hung (0: never; unset in a
    job spec: the site's [hang])."""

    startup_s: FiniteFloat | None = Field(
        None,
        ge=0,
        le=MAX_TIMEOUT_S,
        description=(
            "process start to the end of the first training step (imports, rendezvous, checkpoint load, the first "
            "step's set-up)"
        ),
    )
    step_s: FiniteFloat | None = Field(
        None, ge=0, le=MAX_TIMEOUT_S, description=("one training step, a synchronous checkpoint save included")
    )
    output_s: FiniteFloat | None = Field(
        None,
        ge=0,
        le=MAX_TIMEOUT_S,
        description="the job's log gaining nothing: for code that asks no guard (PreemptionGuard, the callbacks)",
    )
    buffered_output: bool | None = Field(
        None,
        description=(
            "under output_s, leave a Python entry point's stdout block-buffered (by default its ranks run with "
            "PYTHONUNBUFFERED=1, so that the log grows as they print, not as an 8 KiB buffer fills)"
        ),
    )

    def over(self, defaults: HangPolicy) -> HangPolicy:
        """These settings, ``defaults``' where unset, 0 (off) where both are."""
        return HangPolicy.model_validate(
            {
                name: next((v for v in (getattr(self, name), getattr(defaults, name)) if v is not None), 0)
                for name in HangPolicy.model_fields
            },
            strict=False,  # 0 for buffered_output: False
        )


IDLE_DEFAULTS: dict[str, Any] = {
    "sample_s": 5.0,
    "below_percent": 5.0,
    "after_minutes": 1.0,
    "alert_minutes": 10.0,
    "action": "alert",
    "cancel_minutes": 60.0,
}


class IdlePolicy(StrictModel):
    """How each node's sampler reads the job's GPUs (hpctrain.runtime.utilization), and when a GPU counts as idle
    (unset in a job spec: the site's [idle], else IDLE_DEFAULTS)."""

    sample_s: FiniteFloat | None = Field(
        None, ge=1, le=300, description="seconds between two readings of a node's GPUs (default 5)"
    )
    below_percent: FiniteFloat | None = Field(
        None, ge=0, le=100, description="a GPU busy less than this share of the time is idle (default 5)"
    )
    after_minutes: FiniteFloat | None = Field(
        None, ge=0, le=1440, description="a GPU counts as idle once it has stayed so this long (default 1)"
    )
    alert_minutes: FiniteFloat | None = Field(
        None, ge=0, le=10080, description="`hpctrain status` alerts on GPUs idle this long (default 10)"
    )
    action: Literal["alert", "cancel"] | None = Field(
        None, description='"cancel": a job whose every GPU stayed idle cancel_minutes is ended, never requeued'
    )
    cancel_minutes: FiniteFloat | None = Field(
        None,
        ge=0.1,
        le=10080,
        description='with action = "cancel": how long every GPU of the job may idle (default 60)',
    )

    def resolved(self) -> IdlePolicy:
        """These settings, IDLE_DEFAULTS where unset."""
        return self.over(IdlePolicy())

    def over(self, defaults: IdlePolicy) -> IdlePolicy:
        """These settings, ``defaults``' where unset, IDLE_DEFAULTS where both are."""
        return IdlePolicy(
            **{
                name: next((v for v in (getattr(self, name), getattr(defaults, name)) if v is not None), default)
                for name, default in IDLE_DEFAULTS.items()
            }
        )
