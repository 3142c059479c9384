"""The model registry (login node): a checkpoint becomes an immutable, named model version with its lineage
(`versions`); aliases such as production point at one version and move only through the gate, by promotion or
rollback, every move kept (`aliases`); a version is handed on as files that load without hpctrain (`export`).
The rows live in the ledger (`ledger.registry`); the checkpoints a version names are pinned against retention."""
