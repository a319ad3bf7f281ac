"""Who is in the run: the registry of live services, what each serves and how loaded it is
(registry.py), the coordinator's membership/status server and its client (server.py, client.py),
who serves which weight version (versions.py), typed handles on live services (services.py), the
run's status (status.py), and the end of a run for services it did not start (dismiss.py)."""
