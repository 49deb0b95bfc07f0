"""Upstream Kafka as the proxy writes to it.

``producer.py`` owns the producer, ``delivery.py`` turns a batch's delivery reports into one
future, ``availability.py`` tracks whether upstream answers.
"""
