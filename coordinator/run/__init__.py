"""Runs end to end: the rollout run (grpo_run.py: SFT warm start, GRPO, restarts, resume) and the
preference runs (preference_run.py) over what every run shares (base.py: directory, log, status,
services, the steps' records, summary); `tandem eval` (eval_run.py) and `tandem export`
(export_run.py); create.py picks the one a config asks for."""
