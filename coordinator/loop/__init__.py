"""The pieces of a step, shared by the algorithms: the loop's context (context.py), rollouts
over generators (rollout.py, multiturn.py), reward routing (scoring.py), advantages
(advantages.py), prompt groups (groups.py), validation, and weights (weights/)."""
