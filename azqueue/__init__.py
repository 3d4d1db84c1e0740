"""azqueue: a Taskcluster-compatible task queue whose state lives in Azure Storage."""

__version__ = "1.0.0"
