"""A raw Kafka-protocol client for the proxy's tests, built on kafka-python's classes.

It sends exactly the bytes a test asks for (a retried batch, a truncated frame, an unknown API)
and reads responses with a deadline, so a misbehaving proxy fails a test instead of hanging it.
Over TLS too (a SASL_SSL listener, ``kdelay up --secure``'s): the bytes are the same inside it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import socket
import ssl
import struct
import time
from typing import Any

from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from kdelay.proxy.wire import protocol as p

Header = tuple[str, bytes]
#: What a socket raises when the peer has hung up (TLS adds its own EOFs to TCP's).
PEER_CLOSED = (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


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


def produce_with_id(
    client: RawClient, topic: str, value: bytes, pid: int, *, epoch: int, seq: int
) -> Any:
    """One record in a batch of producer id ``pid`` (``epoch``, sequence ``seq``) to partition 0
    of ``topic``; the partition's response."""
    batch = record_batch([(None, value, [])], producer_id=pid, epoch=epoch, base_sequence=seq)
    return client.request(produce_request(topic, 0, batch)).responses[0].partition_responses[0]


def scram_login(client: RawClient, user: str, password: str, mechanism: str) -> None:
    """Log ``client`` in with SCRAM-SHA-256 or -512 (RFC 5802, no channel binding); fails the
    test at a refusal."""
    digest = "sha512" if mechanism == "SCRAM-SHA-512" else "sha256"
    assert client.request(sasl_handshake_request(mechanism)).error_code == 0
    bare = f"n={user},r={secrets.token_urlsafe(18)}"
    first = client.request(sasl_authenticate_request(f"n,,{bare}".encode()))
    assert first.error_code == 0, first
    server_first = bytes(first.auth_bytes).decode()
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        digest, password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    without_proof = f"c=biws,r={fields['r']}"
    message = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.new(hashlib.new(digest, client_key).digest(), message, digest).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    final = client.request(
        sasl_authenticate_request(f"{without_proof},p={proof.decode()}".encode())
    )
    assert final.error_code == 0, final


class RawClient:
    """A blocking socket speaking the Kafka protocol one request at a time; inside TLS when
    ``tls`` is given (a context trusting the listener's CA); from the loopback address
    ``source`` if given (another client address than 127.0.0.1)."""

    def __init__(
        self,
        address: str,
        timeout: float = 10.0,
        tls: ssl.SSLContext | None = None,
        source: str | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        bind = None if source is None else (source, 0)
        sock = socket.create_connection((host, int(port)), timeout=timeout, source_address=bind)
        self.sock = sock if tls is None else tls.wrap_socket(sock, server_hostname=host)
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
        prefix = self.read_exact(4)
        if prefix is None:
            return None
        (size,) = struct.unpack(">i", prefix)
        return self.read_exact(size)

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
        except PEER_CLOSED:
            return True
        except TimeoutError:
            return False

    def read_exact(self, n: int) -> bytes | None:
        """``n`` bytes, or None when the peer hung up first; TimeoutError if it went quiet."""
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except PEER_CLOSED:
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)
