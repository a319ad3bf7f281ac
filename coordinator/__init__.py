"""Coordinator service: drives the RL post-training loop."""
