"""The rollout gateway: agents written against the OpenAI client, trained on exactly the tokens
the generators sampled (service.py, episodes.py, toolcalls.py, server.py, agents.py)."""
