"""Queries: what a replica answers about its messages, from the store.

Modules: ``queries`` (counts and buckets), ``listing`` (pages of messages), ``timeline`` (one
message's history) and ``message_status`` (one message's state).
"""
