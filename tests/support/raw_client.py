"""A raw Kafka-protocol client for the proxy's tests, built on kafka-python's classes.

It sends exactly the bytes a test asks for (a retried batch, a truncated frame, an unknown API)
and reads responses with a deadline, so a misbehaving proxy fails a test instead of hanging it.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from kdelay.proxy.wire import protocol as p

Header = tuple[str, bytes]


def record_batch(
    records: list[tuple[bytes | None, bytes | None, list[Header]]],
    *,
    producer_id: int = -1,
    epoch: int = -1,
    base_sequence: int = -1,
    compression: int = 0,
    timestamp_ms: int | None = None,
) -> bytes:
    """One v2 record batch (kafka-python's builder)."""
    builder = MemoryRecordsBuilder(2, compression, 10 * 1024 * 1024)
    if producer_id >= 0:
        builder.set_producer_state(producer_id, epoch, base_sequence, False)
    ts = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
    for key, value, headers in records:
        builder.append(ts, key, value, headers)
    builder.close()
    return bytes(builder.buffer())


def produce_request(
    topic: str,
    partition: int,
    batch: bytes | None,
    *,
    version: int = 9,
    acks: int = -1,
    transactional_id: str | None = None,
) -> Any:
    """A Produce request for one partition."""
    req = ProduceRequest
    return req(
        transactional_id=transactional_id,
        acks=acks,
        timeout_ms=30_000,
        topic_data=[
            req.TopicProduceData(
                name=topic,
                partition_data=[
                    req.TopicProduceData.PartitionProduceData(index=partition, records=batch)
                ],
            )
        ],
        version=version,
    )


def metadata_request(topics: list[str] | None, *, version: int = 12, create: bool = True) -> Any:
    """A Metadata request (``topics`` None: all topics)."""
    return MetadataRequest(
        topics=None
        if topics is None
        else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
        allow_auto_topic_creation=create,
        include_topic_authorized_operations=False,
        version=version,
    )


def init_producer_id_request(
    version: int = 4, transactional_id: str | None = None, producer_id: int = -1, epoch: int = -1
) -> Any:
    """An InitProducerId request."""
    return InitProducerIdRequest(
        transactional_id=transactional_id,
        transaction_timeout_ms=60_000,
        producer_id=producer_id,
        producer_epoch=epoch,
        version=version,
    )


def sasl_handshake_request(mechanism: str, *, version: int = 1) -> Any:
    """A SaslHandshake request naming ``mechanism``."""
    return SaslHandshakeRequest(mechanism=mechanism, version=version)


def sasl_authenticate_request(token: bytes, *, version: int = 2) -> Any:
    """A SaslAuthenticate request carrying ``token``."""
    return SaslAuthenticateRequest(auth_bytes=token, version=version)


def plain_token(user: str, password: str) -> bytes:
    """PLAIN's one token (RFC 4616): no authzid, the user, the password."""
    return f"\0{user}\0{password}".encode()


class RawClient:
    """A blocking socket speaking the Kafka protocol one request at a time."""

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def encode(self, request: Any, correlation_id: int | None = None) -> bytes:
        if correlation_id is None:
            self._correlation += 1
            correlation_id = self._correlation
        request.with_header(correlation_id=correlation_id, client_id="kdelay-raw")
        return bytes(request.encode(header=True, framed=True))

    def request(self, request: Any) -> Any:
        """Send ``request`` and decode its response (same version)."""
        self.send_bytes(self.encode(request))
        return self.read_response(request)

    def read_frame(self) -> bytes | None:
        """The next response frame, or None when the proxy closed the connection."""
        prefix = self._read_exact(4)
        if prefix is None:
            return None
        (size,) = struct.unpack(">i", prefix)
        return self._read_exact(size)

    def read_response(self, request: Any) -> Any:
        frame = self.read_frame()
        if frame is None:
            raise ConnectionError("the proxy closed the connection")
        spec = p.APIS.get(request.API_KEY) or p.SASL_APIS[request.API_KEY]
        return spec.response.decode(frame, version=request.API_VERSION, header=True)

    def closed_by_peer(self) -> bool:
        """Whether the proxy closes this connection (read until EOF, within the timeout)."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def _read_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)
