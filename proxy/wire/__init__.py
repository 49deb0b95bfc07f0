"""The Kafka wire format: ``protocol.py`` the request and response framing and API versions,
``records.py`` one partition's record batch read, ``decompress.py`` its bounded decompression.
"""
