"""The handlers of the Queue API, one module a domain, each with its route table
(``ROUTES``): ``tasks``, ``claims``, ``artifacts``, ``groups``, ``workers``, ``counts``
and ``meta``. ``azqueue.api.app`` serves them together."""
