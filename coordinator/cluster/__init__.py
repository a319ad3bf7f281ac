"""The run's services as a cluster: membership (registry.py, the coordinator's server.py and its
client.py), who serves which weight version (versions.py), typed handles on live services
(services.py), launching and adopting local processes (launcher.py, adopted.py, specs.py,
local.py) and the run's status."""
