"""The store's RocksDB keyspace: every column family, key prefix and byte format, here only.

Column families (keys and values raw bytes):

- ``default`` (entries): key ``deliver_at (8) | order (8) | buffer partition (4) | buffer
  offset (8)`` (:data:`ENTRY_KEY`; before the order field :data:`ENTRY_KEY_V1`, read only), so
  iteration order is due time, then acceptance order; value the versioned codec of ``entry.py``
  (a head, then length-prefixed fields).
- ``ids``: ``len(id) (2) | id | buffer key`` -> entry key (:data:`ID_LEN`, ``ids.py``), for
  cancels, tombstones and records written twice; ``meta``'s :data:`META_IDS_FORMAT` names its
  format.
- ``meta``: :data:`META_OFFSET` ``<partition>`` -> next buffer offset to consume (8,
  big-endian); :data:`META_PENDING` -> entry count; :data:`META_CHECKPOINT` -> the last
  checkpoint this replica applied (``kdelay.checkpoint``'s bytes); ``cancel/...``: the open
  cancels (``cancel_keys.py``); ``bulk/...``: bulk cancels (``bulk_cancels.py``); ``owed/
  <partition> <buffer key>``: the tombstones this store owes the buffer topic until it reads
  them back (``owed_tombstones.py``); :data:`META_OUTCOMES` -> the count of outcomes kept.
- ``outcomes``, ``outcome_time``: what became of the messages that left the store, by id, and
  ``time (8) | id`` to prune them by age (``outcomes.py``).

The modules named above build and read keys and values with the prefixes and ``struct`` formats
defined here; ``tests/unit/test_keyspace.py`` fails on a prefix or a format written anywhere
else in the delay service.
"""

from __future__ import annotations

import struct

# Column families.
CF_IDS = "ids"
CF_META = "meta"
CF_OUTCOMES = "outcomes"
CF_OUTCOME_TIME = "outcome_time"
#: Every column family but ``default``.
COLUMN_FAMILIES = (CF_IDS, CF_META, CF_OUTCOMES, CF_OUTCOME_TIME)

#: Appended to a key: the smallest key that sorts after it.
NEXT_KEY = b"\x00"
#: A big-endian unsigned 64-bit count, offset or time.
U64 = struct.Struct(">Q")

# meta: the store's own state.
META_PENDING = b"pending"
META_CHECKPOINT = b"checkpoint"
META_OFFSET = b"offset/"
META_IDS_FORMAT = b"ids-format"
IDS_FORMAT = b"2"  # index key = len(id) | id | buffer key (ids.py)
META_OUTCOMES = b"outcomes"

# default: entries (entry.py).
ENTRY_KEY = struct.Struct(">QQIQ")
ENTRY_KEY_V1 = struct.Struct(">QIQ")  # before the order field; read only
#: The sizes of an entry key, current and old.
ENTRY_KEY_SIZES = frozenset({ENTRY_KEY.size, ENTRY_KEY_V1.size})
ENTRY_HEAD_V1 = struct.Struct("<BqiH")  # version, deliver_at_ms, partition, header count
ENTRY_HEAD = struct.Struct("<BqiI")  # versions 2 and up: the header count as wide as Kafka's
ENTRY_LEN = struct.Struct("<I")
ENTRY_OCCURRENCE = struct.Struct("<I")

# ids (ids.py).
ID_LEN = struct.Struct(">H")

# meta: open cancels (cancel_keys.py).
CANCEL_N = b"cancel/n/"
CANCEL_W = b"cancel/w/"
CANCEL_I = b"cancel/i/"
CANCEL_S = b"cancel/s/"
CANCEL_P = struct.Struct(">I")
CANCEL_PO = struct.Struct(">IQ")
CANCEL_Q = struct.Struct(">Q")
CANCEL_COUNTS = struct.Struct(">QQ")
CANCEL_AT = struct.Struct(">Qq")  # offset, time (then b"r" or b"R..." when it is a replace's)
CANCEL_REPLACE = b"r"
CANCEL_REPLACE_OF = b"R"  # then len (1 byte) and the replace's buffer key
CANCEL_ADMIN = b"A"
CANCEL_SENDER = b"W"
CANCEL_STAMP = b"Q"  # then len (2 bytes) and the cancel's producer-sequence stamp
CANCEL_STAMP_LEN = struct.Struct(">H")
CANCEL_OPEN = struct.Struct(">qQH")  # time, number, len(id): at most kdelay.buffer.MAX_ID_BYTES

# meta: bulk cancels (bulk_cancels.py).
BULK_OPEN = b"bulk/o/"
BULK_RESULT = b"bulk/r/"
BULK_BY_TIME = b"bulk/t/"
BULK_PROGRESS = b"bulk/p/"
BULK_PO = struct.Struct(">IQ")
BULK_MS = struct.Struct(">Q")
BULK_LEN = struct.Struct(">H")

# meta: owed tombstones (owed_tombstones.py).
OWED_PREFIX = b"owed/"
OWED_P = struct.Struct(">I")
OWED_VALUE = struct.Struct(">QQH")  # number, offset, len(id)
