"""Datasets the loop reads: prompt/answer examples, preference pairs, and the tokenizer."""
