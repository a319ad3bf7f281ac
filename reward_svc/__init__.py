"""reward_svc: scores completions for one or more tasks (environments) over gRPC."""
