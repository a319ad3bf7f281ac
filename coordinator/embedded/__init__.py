"""Embedded default model and task: a tiny local Llama and synthetic arithmetic."""
