"""Scorers, one module per environment. Each is a pure function
`score(completion, ground_truth) -> ScoreResult` that runs inside a worker process."""
