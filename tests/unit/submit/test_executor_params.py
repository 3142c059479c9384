"""The executor's parameters are checked by name and type before submitit converts any: a wrong one is one
ConfigError line "executor parameters: <name>: ...", never an OverflowError, ValueError or TypeError."""

from __future__ import annotations

import math

import pytest

from hpctrain.errors import ConfigError
from hpctrain.submit.executor import HPCTRAIN_FIELDS, SUBMITIT_FIELDS, Executor, ExecutorParameters

MINUTES = "expected a positive number of minutes or a Slurm time such as '04:00:00'"


@pytest.mark.parametrize("params, problem", [
    ({"time": math.inf}, f"time: {MINUTES}, got inf"),
    ({"time": math.nan}, f"time: {MINUTES}, got nan"),
    ({"time": True}, f"time: {MINUTES}, got True"),
    ({"timeout_min": math.nan}, f"timeout_min: {MINUTES}, got nan"),
    ({"timeout_min": -5}, f"timeout_min: {MINUTES}, got -5"),
    ({"mem_gb": math.inf}, "mem_gb: expected a finite number, got inf"),
    ({"mem_gb": "4"}, "mem_gb: expected a number, got '4'"),
    ({"mem_gb": None}, "mem_gb: expected a number, got None"),
    ({"mem": 1.5}, "mem: expected a memory size such as '16G' or '512M', got 1.5"),
    ({"setup": "module load cuda"}, "setup: expected a list, got 'module load cuda'"),
    ({"setup": ["ok", 3]}, "setup[1]: expected a string, got 3"),
    ({"name": 3}, "name: expected a string, got 3"),
    ({"job_name": None}, "job_name: expected a string, got None"),
    ({"nodes": "2"}, "nodes: expected an integer, got '2'"),
    ({"tasks_per_node": 1.0}, "tasks_per_node: expected an integer, got 1.0"),
    ({"array_parallelism": True}, "array_parallelism: expected an integer, got True"),
    ({"dependency": 123}, "dependency: expected a string, got 123"),
    ({"preemptible": "yes"}, "preemptible: expected true or false, got 'yes'"),
    ({"env": ["A=1"]}, "env: expected a table, got ['A=1']"),
    ({"workdir": 7}, "workdir: expected a path, got 7"),
])
def test_a_parameter_of_a_wrong_type_is_one_line_naming_it(params, problem):
    ex = Executor(site="dev")
    with pytest.raises(ConfigError) as err:
        ex.update_parameters(**params)
    assert str(err.value) == f"executor parameters: {problem}"
    assert ex.parameters == {} and ex.hpctrain_parameters == {}  # nothing of a refused update is kept


def test_every_parameter_is_typed():
    """The checked names are submitit's generic ones and every name job_spec maps."""
    generic = set(Executor._equivalence_dict())
    assert set(ExecutorParameters.model_fields) == generic | set(SUBMITIT_FIELDS) | set(HPCTRAIN_FIELDS)


def test_good_values_and_none_still_make_the_job_spec():
    ex = Executor(site="dev")
    ex.update_parameters(timeout_min=90.5, mem_gb=1.5, time=None, partition=None, tasks_per_node=None, setup=[])
    spec = ex.job_spec(1)
    assert (spec.resources.time, spec.resources.mem, spec.resources.partition) == (5400, 1536, None)
    ex.update_parameters(time="1-00:00:00", mem="2G", array_parallelism=None)
    many = ex.job_spec(4)
    assert (many.resources.time, many.resources.mem, many.array.throttle) == (86400, 2048, None)


@pytest.mark.parametrize("options, problem", [
    ({"max_pickle_size_gb": math.nan}, "max_pickle_size_gb: expected a finite number, got nan"),
    ({"max_pickle_size_gb": "1"}, "max_pickle_size_gb: expected a number, got '1'"),
    ({"python": ["python3"]}, "python: expected a string, got ['python3']"),
])
def test_the_executors_own_settings_are_checked_too(options, problem):
    with pytest.raises(ConfigError) as err:
        Executor(site="dev", **options)
    assert str(err.value) == f"executor parameters: {problem}"
