"""Tools for testing azqueue against real services, shared by its tests and benchmarks and
open to other projects: the pytest plugin and its harness (``pytest_plugin``,
``harness``), a server on the running event loop (``inprocess``) or ``azqueue serve`` in
a process of its own (``processes``), a proxy in front of Azurite that counts requests
(``requestkinds``) and injects Azure's failures on demand (``faultproxy``), a client kit
for speaking the queue's HTTP API by hand (``tasks``, ``hawk``, ``sas``) and a reader of
what a server stored (``storage``)."""
