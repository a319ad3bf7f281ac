"""Scorers, one module per environment. Each is a function
`score(completion, ground_truth, ...) -> ScoreResult` that runs inside a worker process (the
engine passes what each needs from the settings: math its timeout, code its sandbox limits)."""
