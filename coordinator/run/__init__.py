"""Runs end to end: the rollout run (grpo_run.py) and preference runs (preference_run.py) over
what every run shares (base.py: directory, logs, status, metrics, progress, summary), with loop
checkpoints and resume (checkpoint.py, resume.py); create.py picks the one a config asks for."""
