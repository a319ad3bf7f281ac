"""A run's persistence: loop checkpoints on disk (store.py), the coordinator's half of them and
resuming from one (resume.py) with the metric history they mark in metrics.jsonl (history.py),
and Hugging Face exports of the trained model (export.py)."""
