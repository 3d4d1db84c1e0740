"""The pure domain: task definitions, runs and their transitions, tips, status.

Nothing here performs I/O or imports anything outside the standard library.
"""
