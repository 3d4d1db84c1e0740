"""The HTTP API: Taskcluster Queue v1 routes, served by aiohttp."""
