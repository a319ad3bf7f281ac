"""What a run shows and keeps of itself while it runs: metrics.jsonl and the sinks (log.py,
sinks.py: TensorBoard, W&B, MLflow), the curves (plot.py), and progress on the console
(progress.py: bars in a terminal, timestamped lines elsewhere, the start-up wait in words)."""
