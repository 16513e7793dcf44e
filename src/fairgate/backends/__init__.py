"""Shared backends: the one Redis client set-up and the deadline every backend call runs under.

The quota store, the metadata database's token store and the resilience store all reach Redis;
they share this package's client construction (one pool, one retry and timeout policy) instead of
each building its own.
"""
