"""Settings, parsed once from ``AZQUEUE_*`` environment variables and passed down.

``settings``: ``Settings`` and its ``from_env``; ``variables``: every variable once
(``SETTINGS``), which ``from_env``, `azqueue serve --help` and the docs' settings table
read; ``storage``: the storage account; ``clients``: the clients and their secrets.
Import from here: the names below are this package's face.
"""

from azqueue.config.clients import MIN_ACCESS_TOKEN, Client, is_placeholder
from azqueue.config.settings import (DEFAULT_ANONYMOUS_SCOPES, Settings, check_required,
                                     new_secret, shown_default, variables_help)
from azqueue.config.storage import StorageSettings, connection_settings
from azqueue.config.variables import SETTINGS, Setting
from azqueue.errors import ConfigError

__all__ = ["DEFAULT_ANONYMOUS_SCOPES", "MIN_ACCESS_TOKEN", "SETTINGS", "Client", "ConfigError",
           "Setting", "Settings", "StorageSettings", "check_required", "connection_settings",
           "is_placeholder", "new_secret", "shown_default", "variables_help"]
