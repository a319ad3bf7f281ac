"""The `tandem` command (main.py), `tandem status` (status.py), and the entry point of services
started by others: containers and other hosts (container.py)."""
