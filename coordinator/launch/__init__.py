"""Starting and keeping the run's services: each service's settings and command (specs.py), local
child processes (launcher.py, adopted.py for those an earlier coordinator started, log_cause.py
for why one died), local mode's cluster as one context manager (local.py), relaunching the dead
(supervisor.py, with whether the trainer is dead), evaluation's smaller cluster (inference.py), and Slurm jobs
(slurm.py)."""
