"""Everything that talks to Azure Storage; the only package of the server that imports
``azure.*`` (``tests/unit/test_source.py`` checks it; the test kit's ``testing/storage.py``
reads a server's storage from outside, as a test would).

Azure SDK exceptions never leave this package: ``errors.translate`` turns them into the
exceptions defined there, or into ``azqueue.errors`` where a client is concerned.
"""
