"""The gate of a model's promotions: which evaluator's result on which metric decides, in which direction, and
whether a version's result passes against the alias's current target (and the threshold)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hpctrain.config.job import GatePolicy
from hpctrain.ledger import Ledger
from hpctrain.ledger.evaluations import ASK_AGAIN, DONE, OPEN
from hpctrain.ledger.rows import ModelRow, VersionRow


@dataclass(frozen=True)
class Gate:
    evaluator: str
    metric: str
    mode: str  # "min": lower is better; "max": higher is better
    threshold: float | None = None

    @classmethod
    def of(cls, policy: GatePolicy) -> Gate:
        return cls(policy.evaluator, policy.metric, policy.mode, policy.threshold)

    @classmethod
    def of_model(cls, model: ModelRow) -> Gate:
        return cls(model["gate_evaluator"], model["gate_metric"], model["gate_mode"], model["gate_threshold"])

    def __str__(self) -> str:
        bound = "" if self.threshold is None else f", {'<=' if self.mode == 'min' else '>='} {self.threshold:g}"
        return f"{self.evaluator} {self.metric} ({'lower' if self.mode == 'min' else 'higher'} is better{bound})"

    def result(self, ledger: Ledger, version: VersionRow) -> float | None:
        """The version's value of the gate's metric from the gate's evaluator (None: no such result yet)."""
        row = ledger.evaluations.get(version["job_id"], version["task_index"], version["step"], self.evaluator)
        if row is None or row["state"] != DONE or not row["metrics_json"]:
            return None
        value = json.loads(row["metrics_json"]).get(self.metric)
        return float(value) if isinstance(value, (int, float)) else None

    def no_worse(self, value: float, than: float) -> bool:
        return value <= than if self.mode == "min" else value >= than

    def within_threshold(self, value: float) -> bool:
        return self.threshold is None or self.no_worse(value, self.threshold)

    def how_to_evaluate(self, ledger: Ledger, version: VersionRow) -> str:
        """What gives the version a result: the command that asks for it (again, where it failed), or the wait."""
        job, step = version["job_id"], version["step"]
        row = ledger.evaluations.get(job, version["task_index"], step, self.evaluator)
        command = f"hpctrain eval {job} --step {step} --evaluator {self.evaluator}"
        if row is None:
            return f"evaluate job {job} step {step}: {command}"
        if row["state"] in ASK_AGAIN:
            return f"its evaluation {row['state']}: {row['error'] or '-'}; ask again: {command} --retry"
        if row["state"] in OPEN:
            return f"its evaluation is {row['state']}: `hpctrain reconcile` folds its result in once its job ends"
        return f"its {self.evaluator} evaluation is done but reports no {self.metric}"
