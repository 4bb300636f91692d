"""The result dataclasses of gpumem.results have exactly the fields of the reports' JSON
schema that the Rust tests pin (testdata/schema/reports.json): a field added to or removed
from a Rust report fails here until the dataclass follows."""

import dataclasses
import json
import types
import typing

import pytest

from gpumem import results
from conftest import REPO

SCHEMA = json.loads((REPO / "testdata" / "schema" / "reports.json").read_text())

#: The dataclass of each report of the schema (the ranks report has none: Python replays one
#: trace per call).
TOP = {
    "plan": results.Plan,
    "replay": results.Replay,
    "tune": results.Tune,
    "selftest": results.Selftest,
    "policies": results.Policy,
}


def may_be_absent(shape) -> bool:
    """Whether the schema says a field may be left out of the JSON."""
    if isinstance(shape, dict):
        return "absent" in shape.get("?", "")
    return isinstance(shape, str) and "absent" in shape.split("|")


def mismatches(kind: type, shape: dict, path: str) -> list[str]:
    """Where ``kind``'s fields differ from the object ``shape``, recursively."""
    hints = typing.get_type_hints(kind)
    fields = {f.name: f for f in dataclasses.fields(kind)}
    keys = set(shape) - {"?"}
    # A field left out when empty may be missing from an example the schema was made from.
    found = [f"{path}: field {name} is not in the schema" for name in sorted(set(fields) - keys)
             if fields[name].default is dataclasses.MISSING]
    found += [f"{path}: schema field {name} has no dataclass field"
              for name in sorted(keys - set(fields))]
    for name in sorted(keys & set(fields)):
        has_default = fields[name].default is not dataclasses.MISSING
        if may_be_absent(shape[name]) and not has_default:
            found.append(f"{path}.{name}: may be absent but has no default")
        found += nested(hints[name], shape[name], f"{path}.{name}")
    return found


def nested(hint, shape, path: str) -> list[str]:
    """The mismatches of a field's type with its shape: into dataclasses, lists, optionals."""
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
    if optional:
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, type) and issubclass(hint, results.Report):
        if isinstance(shape, dict):
            return mismatches(hint, shape, path)
        # The examples the schema was made from had none: only an optional field may be so.
        if optional and set(str(shape).split("|")) <= {"null", "absent"}:
            return []
        return [f"{path}: a {hint.__name__} in Python, {shape!r} in the schema"]
    if typing.get_origin(hint) is list and isinstance(shape, list) and shape:
        return nested(typing.get_args(hint)[0], shape[0], f"{path}[]")
    return []


@pytest.mark.parametrize("report", sorted(TOP))
def test_the_dataclasses_have_the_schemas_fields(report):
    shape = SCHEMA[report]
    if isinstance(shape, list):
        shape = shape[0]
    assert mismatches(TOP[report], shape, report) == []


def test_a_missing_field_is_found():
    shape = dict(SCHEMA["policies"][0], extra="integer")
    assert mismatches(results.Policy, shape, "policies") == [
        "policies: schema field extra has no dataclass field"]
