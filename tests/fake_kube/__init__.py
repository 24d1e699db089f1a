"""A stand-in Kubernetes API server (server.py) and the objects it serves (pods.py, ...)."""
