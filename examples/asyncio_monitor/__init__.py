"""An asyncio-only service: scheduled TCP probes run as jobs by a worker on the same event loop."""
