"""What every room shares and none owns: awaiting many storage calls a few at a time
(``gathering.py``) and the pages of a listing, their continuation tokens and the bytes
they may hold (``paging.py``), and the parts of a process declared with what they need,
started in that order and stopped in the reverse (``components.py``, which ``wiring``
declares the components with).

May use: no other room.
"""
