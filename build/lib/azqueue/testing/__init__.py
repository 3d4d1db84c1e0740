"""Tools for testing azqueue against real services, shared by its tests and benchmarks and
open to other projects: the pytest plugin and its harness (``pytest_plugin``,
``harness``), Azure's failures on demand (``faultproxy``), a client kit for speaking the
queue's HTTP API by hand (``tasks``, ``hawk``, ``sas``, ``processes``) and a reader of
what a server stored (``storage``)."""
