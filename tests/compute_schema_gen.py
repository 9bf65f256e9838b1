"""Writes (``--write``) or checks tpunb/sandbox/compute/compute_schema.json: the compute v1 messages the
sandbox's Compute Engine API accepts in request bodies, read from google-cloud-compute's own
message classes (field JSON names, scalar kinds, nested messages, and the enum each string field
names: compute v1's enums travel as plain strings). The emulator validates every body with it;
tests/test_compute_emulator.py checks the file still matches the installed google-cloud-compute."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.proto_check import repeated

SCHEMA = Path(__file__).resolve().parent.parent / "tpunb" / "sandbox" / "compute" / "compute_schema.json"
ROOTS = ("Instance", "InstanceTemplate", "ResourcePolicy", "InstanceGroupManager",
         "InstanceGroupManagerResizeRequest", "Metadata")
#: enum values the floor (1.48.0) has that later releases dropped (absent from 1.57.0): the sandbox
#: refuses them, as a client of today's API cannot send them
DROPPED = {"NetworkInterface.Ipv6AccessType": {"UNSPECIFIED_IPV6_ACCESS_TYPE"},
           "NetworkInterface.StackType": {"UNSPECIFIED_STACK_TYPE"}}
SCALARS = {1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 8: "bool", 9: "string", 12: "bytes",
           13: "uint32", 17: "int32", 18: "int64"}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.rstrip("_").split("_"))


def _kind(field, enums: dict) -> str:
    if field.message_type is not None:
        if field.message_type.GetOptions().map_entry:
            value = field.message_type.fields_by_name["value"]
            return "map:" + (value.message_type.name if value.message_type else SCALARS[value.type])
        return field.message_type.name
    enum = field.containing_type.enum_types_by_name.get(_camel(field.name))
    if field.type == 9 and enum is not None:
        key = f"{field.containing_type.name}.{enum.name}"
        enums[key] = sorted(v for v in enum.values_by_name
                            if not v.startswith("UNDEFINED_") and v not in DROPPED.get(key, ()))
        return "enum:" + key
    return SCALARS[field.type]


def build() -> dict:
    from google.cloud import compute_v1

    messages: dict[str, dict[str, str]] = {}
    enums: dict[str, list[str]] = {}
    todo = [getattr(compute_v1, root).pb().DESCRIPTOR for root in ROOTS]
    while todo:
        descriptor = todo.pop()
        if descriptor.name in messages:
            continue
        fields = messages[descriptor.name] = {}
        for field in descriptor.fields:
            kind = _kind(field, enums)
            fields[field.json_name] = ("[]" if repeated(field) and not kind.startswith("map:") else "") + kind
            target = field.message_type
            if target is not None and target.GetOptions().map_entry:
                target = target.fields_by_name["value"].message_type
            if target is not None:
                todo.append(target)
    return {"roots": list(ROOTS), "messages": dict(sorted(messages.items())), "enums": dict(sorted(enums.items()))}


def render(schema: dict) -> str:
    """One message per line: small diffs when google-cloud-compute adds a field."""
    lines = ["{", f' "roots": {json.dumps(schema["roots"])},', ' "messages": {']
    lines += [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in schema["messages"].items()]
    lines[-1] = lines[-1].rstrip(",")
    lines += [" },", ' "enums": {']
    lines += [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in schema["enums"].items()]
    lines[-1] = lines[-1].rstrip(",")
    lines += [" }", "}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    text = render(build())
    if sys.argv[1:] == ["--write"]:
        SCHEMA.write_text(text)
        print(f"wrote {SCHEMA} ({len(text)} bytes)")
    else:
        print("up to date" if SCHEMA.read_text() == text else "differs: run with --write")
