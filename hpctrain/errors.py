"""Errors a user can act on: the CLI prints them as one line, without a traceback."""


class HpctrainError(Exception):
    """Base for every error caused by input, configuration or the cluster's state."""


class ConfigError(HpctrainError):
    """A site config or job spec is missing, unreadable or invalid."""


class SlurmError(HpctrainError):
    """A Slurm command is missing, failed, or the controller is unreachable."""


class SlurmTimeout(SlurmError):
    """A Slurm command gave no answer in time: what it asked for may or may not have happened."""


class LedgerError(HpctrainError):
    """The ledger file cannot be opened or migrated."""


class CheckpointError(HpctrainError):
    """A checkpoint is missing, incomplete, corrupt or cannot be written."""


class DataError(HpctrainError):
    """A dataset index, shard or loader state is missing, corrupt or incompatible."""
