"""The algorithms' step functions: each reads like its algorithm, phases named in order."""
