"""The supervisor that runs tritonserver: heals dead pipelines, restarts a crashed server,
drains on SIGTERM and cleans up stubs and shared memory. See supervisor.py."""
