"""What every room shares and none owns: awaiting many storage calls a few at a time
(``gathering.py``) and the pages of a listing, their continuation tokens and the bytes
they may hold (``paging.py``).

May use: no other room.
"""
