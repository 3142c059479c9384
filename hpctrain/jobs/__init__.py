"""The job lifecycle on the login node, after submission: polling Slurm into the ledger (`poll`), folding
journals and deciding on runs that died silently (`reconcile`, `supervise`), flags on running jobs
(`alerts`) and GPU-hours (`accounting`)."""
