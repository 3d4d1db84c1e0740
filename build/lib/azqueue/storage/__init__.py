"""Everything that talks to Azure Storage; the only package that imports ``azure.*``.

Azure SDK exceptions never leave this package: ``errors.translate`` turns them into the
exceptions defined there, or into ``azqueue.errors`` where a client is concerned.
"""
