"""A run's artifacts: their records, URLs and listings (``artifacts.py``), and receiving
an ``s3`` artifact's content (``uploads.py``).

May use: ``azqueue.service.common``.
"""
