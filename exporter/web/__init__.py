"""Endpoint security and limits: the exporter-toolkit web config (`--web.config.file`: TLS, client
certificates, basic auth with bcrypt hashes, response headers, a rate limit), reloaded while the
daemon runs, and the listener that bounds slow and excess clients (`--web.max-requests`)."""
