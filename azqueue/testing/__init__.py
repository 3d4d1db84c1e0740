"""Tools for testing azqueue against real services: a fault-injecting storage proxy."""
