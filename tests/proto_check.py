"""Checks one recorded emulator call against Google's own definitions (the tpu_v2 messages that
google-cloud-tpu ships), strictly: unknown fields fail, enum numbers must be defined, Any payloads
must be the type that method returns, and re-serialising the parsed message must give the same
JSON back (so no default values or spellings the real API would not send). Errors are checked
against the HTTP error shape and google.rpc.Code's HTTP mapping. Used by tests/test_proto_strict.py
and by the tpu_emulator fixture, so every test that talks to the emulator is checked.
"""

from __future__ import annotations

import json
import re

import pytest
from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import descriptor_pool, json_format, message_factory, timestamp_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2  # noqa: F401 (registers the detail types)

from tpunb.sandbox.server import Exchange

TYPE = "type.googleapis.com/"
NODE, QR, EMPTY = "google.cloud.tpu.v2.Node", "google.cloud.tpu.v2.QueuedResource", "google.protobuf.Empty"

_LOC = r"^/v2/projects/[^/]+/locations/[^/]+/"
Route = tuple[str, re.Pattern, type, "type | None", type]  # method, path, request (query), body, answer


def _routes(kind: str, singular: str, plural: str, writable: bool = False) -> list[Route]:
    """The REST methods of one collection, with tpu_v2's own message names (ListNodesRequest, ...)."""
    item, one = getattr(tpu_v2, singular), re.compile(_LOC + kind + r"/[^/:]+$")
    out: list[Route] = [
        ("GET", re.compile(_LOC + kind + "$"), getattr(tpu_v2, f"List{plural}Request"), None,
         getattr(tpu_v2, f"List{plural}Response")),
        ("GET", one, getattr(tpu_v2, f"Get{singular}Request"), None, item)]
    if writable:
        out += [("POST", re.compile(_LOC + kind + "$"), getattr(tpu_v2, f"Create{singular}Request"), item,
                 operations_pb2.Operation),
                ("DELETE", one, getattr(tpu_v2, f"Delete{singular}Request"), None, operations_pb2.Operation)]
    return out


ROUTES: list[Route] = [
    *_routes("nodes", "Node", "Nodes", writable=True),
    *_routes("queuedResources", "QueuedResource", "QueuedResources", writable=True),
    *_routes("acceleratorTypes", "AcceleratorType", "AcceleratorTypes"),
    *_routes("runtimeVersions", "RuntimeVersion", "RuntimeVersions"),
    ("GET", re.compile(_LOC + r"operations/[^/:]+$"), operations_pb2.GetOperationRequest, None,
     operations_pb2.Operation),
    ("PATCH", re.compile(_LOC + r"nodes/[^/:]+$"), tpu_v2.UpdateNodeRequest, tpu_v2.Node, operations_pb2.Operation),
    ("POST", re.compile(_LOC + r"nodes/[^/:]+:getGuestAttributes$"), tpu_v2.GetGuestAttributesRequest,
     tpu_v2.GetGuestAttributesRequest, tpu_v2.GetGuestAttributesResponse),
]
# google/rpc/code.proto: each canonical code's HTTP status
HTTP_OF_CODE = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400, "UNAUTHENTICATED": 401,
                "PERMISSION_DENIED": 403, "NOT_FOUND": 404, "ABORTED": 409, "ALREADY_EXISTS": 409,
                "RESOURCE_EXHAUSTED": 429, "CANCELLED": 499, "UNKNOWN": 500, "INTERNAL": 500, "DATA_LOSS": 500,
                "UNIMPLEMENTED": 501, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}
# which Any a finished operation may carry, by the verb in its metadata and what it targets
OP_RESPONSES = {("create", "nodes"): NODE, ("create", "queuedResources"): QR, ("update", "nodes"): NODE,
                ("delete", "nodes"): EMPTY, ("delete", "queuedResources"): EMPTY}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def _pb(message_type: type) -> Message:
    """An empty protobuf message of ``message_type`` (proto-plus or plain protobuf class)."""
    return message_type.pb()() if hasattr(message_type, "pb") else message_type()


def strict(raw: bytes | str | dict, message_type: type, what: str) -> Message:
    """Parse JSON into ``message_type``: unknown fields and unknown enum names fail; then every
    enum number must be defined and the JSON must survive a round trip unchanged."""
    data = json.loads(raw) if isinstance(raw, (bytes, str)) else raw
    message = _pb(message_type)
    try:
        json_format.ParseDict(data, message, ignore_unknown_fields=False)
    except json_format.ParseError as e:
        pytest.fail(f"{what}: not a valid {message.DESCRIPTOR.full_name}: {e}")
    _check_enums(message, what)
    again = json_format.MessageToDict(message)
    assert again == _normalised(data), f"{what}: differs from its {message.DESCRIPTOR.full_name} round trip"
    return message


def _normalised(data: object) -> object:
    """``data`` with every timestamp in protobuf's canonical spelling (same instant, digits may differ)."""
    if isinstance(data, dict):
        return {k: _normalised(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_normalised(v) for v in data]
    if isinstance(data, str) and RFC3339.match(data):
        stamp = timestamp_pb2.Timestamp()
        stamp.FromJsonString(data)
        return stamp.ToJsonString()
    return data


def _unpack(any_message: Message) -> Message:
    name = any_message.type_url.split("/", 1)[1]
    descriptor = descriptor_pool.Default().FindMessageTypeByName(name)
    inner = message_factory.GetMessageClass(descriptor)()
    assert any_message.Unpack(inner)
    return inner


def repeated(field) -> bool:
    """protobuf 6.31+ says ``is_repeated``; older ones (Colab's 5.29) only have the label."""
    flag = getattr(field, "is_repeated", None)
    return flag if flag is not None else field.label == field.LABEL_REPEATED


def _check_enums(message: Message, what: str) -> None:
    """Proto3 enums are open: json_format accepts any number. The real API only sends defined ones."""
    for field, value in message.ListFields():
        values: list = list(value) if repeated(field) else [value]
        target = field
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            target = field.message_type.fields_by_name["value"]
            values = list(value.values())
        if target.type == FieldDescriptor.TYPE_ENUM:
            for v in values:
                assert v in target.enum_type.values_by_number, f"{what}: {field.full_name} = {v} is not defined"
        elif target.type == FieldDescriptor.TYPE_MESSAGE:
            for v in values:
                inner = _unpack(v) if v.DESCRIPTOR.full_name == "google.protobuf.Any" else v
                _check_enums(inner, what)


def _route(exchange: Exchange) -> tuple[type, type | None, type]:
    for method, pattern, request, body, response in ROUTES:
        if method == exchange.method and pattern.match(exchange.path):
            return request, body, response
    pytest.fail(f"{exchange.method} {exchange.path}: not a tpu_v2 REST method")


def check(exchange: Exchange) -> None:
    """One recorded call against the tpu_v2 definitions: query, body and answer."""
    what = f"{exchange.method} {exchange.path}"
    request_type, body_type, response_type = _route(exchange)
    json_names = {f.json_name for f in _pb(request_type).DESCRIPTOR.fields}
    for key in exchange.query:
        assert key in ("$alt", "enum-encoding") or key in json_names, f"{what}: query parameter {key} is not a request field"
    if body_type is None:
        assert not exchange.request, f"{what}: has a body"
    else:
        message = _pb(body_type)
        json_format.Parse(exchange.request, message, ignore_unknown_fields=False)
        _check_enums(message, f"{what} request")
    if exchange.status != 200:
        check_error(json.loads(exchange.response), exchange.status, what)
        return
    answer = strict(exchange.response, response_type, what)
    if response_type is operations_pb2.Operation:
        check_operation(answer, what)


def check_operation(op: operations_pb2.Operation, what: str) -> None:
    """An Operation carries OperationMetadata, and when done exactly one of error or the right response."""
    metadata = _unpack(op.metadata)
    assert metadata.DESCRIPTOR.full_name == "google.cloud.tpu.v2.OperationMetadata", what
    assert re.match(r"^projects/[^/]+/locations/[^/]+/operations/[^/]+$", op.name), what
    kind = metadata.target.split("/")[-2]
    if op.HasField("response"):
        assert op.done and op.response.type_url == TYPE + OP_RESPONSES[(metadata.verb, kind)], what
    if op.HasField("error"):
        assert op.done and op.error.code in code_pb2.Code.values() and op.error.code != 0, what


def check_error(body: dict, http: int, what: str) -> None:
    """{"error": {code: HTTP status, message, status: google.rpc.Code name, details: [Any]}}."""
    assert set(body) == {"error"}, what
    error = dict(body["error"])
    assert set(error) <= {"code", "message", "status", "details"}, f"{what}: error has {sorted(error)}"
    status = error.pop("status")
    assert error["code"] == http == HTTP_OF_CODE[status], f"{what}: HTTP {http} with status {status}"
    strict({**error, "code": code_pb2.Code.Value(status)}, status_pb2.Status, f"{what} error")
