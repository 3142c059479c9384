"""What the tests share besides fixtures (those are in tests/conftest.py): importable as ``helpers.<module>`` from
every test folder (pytest puts tests/ on sys.path, as the folder of the rootmost conftest.py), by benchmarks/ (they
put tests/ on sys.path) and by the child processes the tests start (spawned ones inherit sys.path; the others get
tests/ on PYTHONPATH from `helpers.paths.tests_on_path`).

- `paths`: the repository, tests/ and tests/assets/.
- `cli`: `hpctrain` in a fresh process, as a user runs it.
- `waiting`: polling for a state that comes "after a while".
- `cluster`: the dev cluster (its script, a spec that preempts everything in QOS low, sacct's GPU-hours) and PATH
  shims of Slurm's commands.
- One module per area: `checkpoint`, `data`, `executor`, `ledger`, `report`, `train`; `bad_input` (generated
  bad and odd input: specs, site configs, typed text) and `packaging` (the wheel and pip's resolutions).
"""
