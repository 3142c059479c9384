"""The ledger in the trackers teams already use (login node): each job's task as one run, across all its requeues,
with its settings, metrics by step and time, evaluation results and, for MLflow, the registry's versions and
aliases (`mlflow`); TensorBoard event files through tensorboard's own writer (`tensorboard`). What a run holds is
read once (`runs`); what MLflow was sent is kept in the ledger, so a later export sends only what is new."""
