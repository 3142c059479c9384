"""`hpctrain doctor`: a site config checked against the live cluster (`cluster`) and, with ``--nccl``, its network
by a job (`network`)."""
