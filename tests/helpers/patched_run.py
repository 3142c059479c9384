"""`python -m helpers.patched_run STEPS LINE`: the reference trainer (its spec from $HPCTRAIN_SPEC) with the line of
Python ``LINE`` run before each step, as helpers.train.patched_trainer's code, for rank launchers that take a module
(helpers.train.torchrun)."""

import sys

from helpers.train import patched_trainer

exec(compile(patched_trainer(int(sys.argv[1]), sys.argv[2]), "<string>", "exec"))
