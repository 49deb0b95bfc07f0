"""Kafka wire-protocol glue: frames, request headers, the APIs the proxy speaks.

The codec itself is kafka-python 3.x's: its request/response classes are generated from Kafka's
own JSON message specs (``kafka/protocol/schemas/resources``) and both decode and encode any
version, so the proxy uses them server-side (decode requests, encode responses). Record batches
(magic v2) are framed with ``kafka.record.MemoryRecords``, decompressed within a size bound by
proxy/wire/decompress.py and their records parsed by aiokafka's compiled classes
(proxy/wire/records.py). What is written here is only the glue a client library has no reason to
provide: the 4-byte length prefix, peeking at the request header's api key / version / correlation
id before choosing a class, and the table of what the proxy advertises.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Final

import kafka.errors as kerr
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from kdelay.errors import KdelayError

PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
FIND_COORDINATOR: Final = 10
SASL_HANDSHAKE: Final = 17
API_VERSIONS: Final = 18
INIT_PRODUCER_ID: Final = 22
SASL_AUTHENTICATE: Final = 36

API_NAMES: Final = {
    PRODUCE: "Produce",
    FETCH: "Fetch",
    LIST_OFFSETS: "ListOffsets",
    METADATA: "Metadata",
    FIND_COORDINATOR: "FindCoordinator",
    API_VERSIONS: "ApiVersions",
    INIT_PRODUCER_ID: "InitProducerId",
    SASL_HANDSHAKE: "SaslHandshake",
    SASL_AUTHENTICATE: "SaslAuthenticate",
}


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """One API the proxy implements: the versions it advertises and accepts."""

    key: int
    advertised_min: int
    advertised_max: int
    accepted_min: int
    request: Any
    response: Any


#: What ApiVersions advertises. Produce advertises v0 like Kafka 4 does although v0-2 are
#: rejected: older librdkafka mis-negotiates when the minimum is above 0 (KAFKA-18659). Produce
#: stops at v12 because v13 addresses topics by id (KIP-516), which the proxy does not map.
#: Metadata stops at v12, the newest that librdkafka and the Java 4.x client both use.
#:
#: Fetch, ListOffsets and FindCoordinator are answered with an authorization error only
#: (proxy/kafka/refusals.py: the proxy serves producers). Fetch must be listed anyway: librdkafka
#: decides whether a broker takes record batch v2 (hence headers, idempotence) from its Fetch
#: range (4 and up) and zstd from Fetch 10 and up (librdkafka's rdkafka_feature.c). Fetch stops
#: at v12 because v13 addresses topics by id (KIP-516); ListOffsets (from v1, as in Kafka 4)
#: and FindCoordinator go as far as kafka-python's classes do.
APIS: Final[dict[int, ApiSpec]] = {
    PRODUCE: ApiSpec(PRODUCE, 0, 12, 3, ProduceRequest, ProduceResponse),
    FETCH: ApiSpec(FETCH, 4, 12, 4, FetchRequest, FetchResponse),
    LIST_OFFSETS: ApiSpec(LIST_OFFSETS, 1, 11, 1, ListOffsetsRequest, ListOffsetsResponse),
    METADATA: ApiSpec(METADATA, 0, 12, 0, MetadataRequest, MetadataResponse),
    FIND_COORDINATOR: ApiSpec(
        FIND_COORDINATOR, 0, 6, 0, FindCoordinatorRequest, FindCoordinatorResponse
    ),
    API_VERSIONS: ApiSpec(API_VERSIONS, 0, 4, 0, ApiVersionsRequest, ApiVersionsResponse),
    INIT_PRODUCER_ID: ApiSpec(
        INIT_PRODUCER_ID, 0, 5, 0, InitProducerIdRequest, InitProducerIdResponse
    ),
}

#: The SASL APIs, advertised only by a listener configured for SASL (proxy/kafka/auth_session.py).
#: SaslHandshake is advertised v0-v1, as Kafka 4 does: librdkafka before 2.1 enables its SASL
#: handshake only when the range includes v0 (its feature map asks for v0), and is otherwise
#: refused every mechanism ("SASL Handshake not supported by broker"); it then sends v1. After a
#: v0 the client's tokens come bare, without SaslAuthenticate (proxy/kafka/sasl_answers.py).
SASL_APIS: Final[dict[int, ApiSpec]] = {
    SASL_HANDSHAKE: ApiSpec(SASL_HANDSHAKE, 0, 1, 0, SaslHandshakeRequest, SaslHandshakeResponse),
    SASL_AUTHENTICATE: ApiSpec(
        SASL_AUTHENTICATE, 0, 2, 0, SaslAuthenticateRequest, SaslAuthenticateResponse
    ),
}
_DECODABLE: Final[dict[int, ApiSpec]] = {**APIS, **SASL_APIS}

#: APIs whose requests above the advertised version are refused as unsupported: ApiVersions
#: (KIP-511), Fetch, whose newer versions address topics by id (KIP-516), and the SASL APIs.
_CAPPED_AT_ADVERTISED: Final = frozenset({API_VERSIONS, FETCH, *SASL_APIS})

_HEADER = struct.Struct(">hhi")  # api key, api version, correlation id (every header version)
_SIZE = struct.Struct(">i")


class ProtocolError(KdelayError):
    """A client sent bytes the proxy cannot or will not decode; its connection is closed."""


class UnsupportedApiError(ProtocolError):
    """A well-formed request for an API or version the proxy does not implement."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        name = API_NAMES.get(api_key, f"api key {api_key}")
        super().__init__(f"{name} v{api_version} is not supported by the proxy")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class Request:
    """A decoded request: the header fields and the kafka-python request object."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any


def error_name(code: int) -> str:
    """Kafka's name for an error code (``INVALID_RECORD``), as kafka-python knows it."""
    return str(kerr.for_code(code).message)


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """Api key, version and correlation id: the first 8 bytes of every request header version."""
    if len(frame) < _HEADER.size:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    key, version, correlation_id = _HEADER.unpack_from(frame)
    return int(key), int(version), int(correlation_id)


#: What a decoder of untrusted input may raise besides ProtocolError. kafka-python's generated
#: decoders index, slice and unpack without checking lengths first.
DECODE_ERRORS: Final = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    OverflowError,
    EOFError,
    UnicodeDecodeError,
    struct.error,
    kerr.KafkaError,
)


def decode_request(frame: bytes) -> Request:
    """Decode one request frame (without its length prefix).

    Raises UnsupportedApiError for an API/version the proxy does not speak (ApiVersions callers
    answer it with UNSUPPORTED_VERSION) and ProtocolError for anything malformed.
    """
    key, version, correlation_id = peek_header(frame)
    spec = _DECODABLE.get(key)
    if spec is None or version < 0:
        raise UnsupportedApiError(key, version, correlation_id)
    if version < spec.accepted_min or version > spec.request.max_version:
        raise UnsupportedApiError(key, version, correlation_id)
    if key in _CAPPED_AT_ADVERTISED and version > spec.advertised_max:
        raise UnsupportedApiError(key, version, correlation_id)
    try:
        body = spec.request.decode(frame, version=version, header=True)
    except DECODE_ERRORS as exc:
        name = API_NAMES[key]
        raise ProtocolError(f"malformed {name} v{version} request: {exc!r}") from None
    header = body.header
    return Request(key, version, correlation_id, header.client_id, body)


def encode_response(request: Request, response: Any) -> bytes:
    """The framed response (length prefix, response header, body) for ``request``.

    ``response`` must have been built with ``version=request.api_version``.
    """
    response.with_header(correlation_id=request.correlation_id)
    return bytes(response.encode(header=True, framed=True))


def api_versions_response(version: int, error_code: int = 0, *, sasl: bool = False) -> Any:
    """The ApiVersions answer (with the SASL APIs when ``sasl``); on UNSUPPORTED_VERSION it is
    sent as v0 (KIP-511)."""
    specs = [*APIS.values(), *(SASL_APIS.values() if sasl else ())]
    keys = [
        ApiVersionsResponse.ApiVersion(
            api_key=s.key, min_version=s.advertised_min, max_version=s.advertised_max
        )
        for s in specs
    ]
    return ApiVersionsResponse(
        error_code=error_code,
        api_keys=keys,
        throttle_time_ms=0,
        supported_features=[],
        finalized_features_epoch=-1,
        finalized_features=[],
        zk_migration_ready=False,
        version=version,
    )


def unsupported_api_versions_frame(correlation_id: int, *, sasl: bool = False) -> bytes:
    """The framed v0 ApiVersions error response a client retries its handshake from."""
    response = api_versions_response(0, kerr.UnsupportedVersionError.errno, sasl=sasl)
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


def frame_size(prefix: bytes) -> int:
    """The request size announced by a 4-byte length prefix."""
    return int(_SIZE.unpack(prefix)[0])
