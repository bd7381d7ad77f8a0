"""The fields of a report's structured facts, each declared once, on the ``api/`` type that holds it.

A structured fact is an object of its own in the report (a GPU's ``nvlink``, ``fabric``, ``pcie`` and
``clocks``, a port of ``spec.nics[]``: ``api/report_fabric.py``; a GPU's ``ecc``, ``retiredPages``,
``remappedRows`` and ``temperature``: ``api/report.py``). Its type there is the only one: the agent fills
it, the operator parses it (the operator keeps the read fields of the last four as ``Device``'s own
attributes). Each field of it is declared with :func:`wire`, which says its report
key, its JSON schema (as the CRD declares it), its description, whether the operator reads it (or why
not) and how the agent compares two samples of it. Everything else takes it from here:

* the agent's writer (``agent/report_fabric.py``) writes each field by :func:`dump`;
* ``api/report_fabric.py``'s parsers read the READ fields by type (:func:`parse_fields`);
* the agent's "significant change" filter compares :func:`significant` of two samples: a telemetry
  field (a counter that climbs on healthy hardware) is written along but is no new fact, a bucketed one
  (a rate, a duty cycle) counts when it moves to another bucket;
* ``api/report_fields.py`` lists each field READ or DROPPED (:func:`read_paths`, :func:`dropped_paths`);
* ``hack/gen_crds.py`` writes each field's schema into the CRD (``{{ fields(NvLink) }}``).

A new sub-field is one :func:`wire` field here, and what fills it in the agent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class FieldError(ValueError):
    """A field of a report that cannot be trusted (``parse_report`` refuses the report)."""


@dataclass(frozen=True)
class Wire:
    """One field of a structured fact as the report carries it."""

    key: str  # its key in the report's object
    schema: Mapping[str, Any]  # its JSON schema as the CRD declares it: type, bounds, enum, items
    description: str = ""
    dropped: str = ""  # why the operator does not read it ("" : api/report_fabric.py parses it)
    telemetry: bool = False  # climbs on healthy hardware: written along, never a reason to write
    bucket: Callable[[Any], Any] | None = None  # compared by bucket (a rate, a duty cycle), not by value
    digits: int | None = None  # a number is written rounded to this many decimals
    required: bool = False  # the object is refused without it (its parser checks: a list's key)

    @property
    def read(self) -> bool:
        return not self.dropped


def wire(
    key: str,
    schema: Mapping[str, Any],
    description: str = "",
    *,
    dropped: str = "",
    telemetry: bool = False,
    bucket: Callable[[Any], Any] | None = None,
    digits: int | None = None,
    required: bool = False,
    default: Any = None,
) -> Any:
    """A dataclass field declared as the report carries it (``default``: unknown, None unless given)."""
    declared = Wire(key, schema, description, dropped, telemetry, bucket, digits, required)
    if required:
        return field(metadata={"wire": declared})
    return field(default=default, metadata={"wire": declared})


_FIELDS: dict[type, tuple[tuple[str, Wire], ...]] = {}


def fields_of(cls: type) -> tuple[tuple[str, Wire], ...]:
    """``cls``'s declared fields: (attribute, declaration), in declaration order (the CRD's order). Kept
    once worked out: the agent compares every GPU's objects every sample."""
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = tuple(
            (f.name, f.metadata["wire"]) for f in dataclasses.fields(cls) if "wire" in f.metadata
        )
    return found


# ---- the agent writes ---------------------------------------------------------------------------------


def _dump(value: Any, w: Wire) -> Any:
    if value is None or value == "":
        return None
    if isinstance(value, tuple | list):
        items = w.schema.get("items", {})
        return [_dump(v, Wire(w.key, items)) for v in sorted(value)][: w.schema.get("maxItems")] or None
    if isinstance(value, str):
        limit = w.schema.get("maxLength")
        return value if limit is None else value[:limit]
    if isinstance(value, float) and w.digits is not None:
        return round(value, w.digits)
    return value


def dump(obj: Any) -> dict[str, Any]:
    """The report's object of ``obj``, in declaration order: an unknown value (None, "", an empty list) is
    left out, never written as zero; a string is cut to its maxLength, a list sorted."""
    out: dict[str, Any] = {}
    for attr, w in fields_of(type(obj)):
        value = _dump(getattr(obj, attr), w)
        if value is not None:
            out[w.key] = value
    return out


def significant(obj: Any) -> tuple[Any, ...]:
    """What of ``obj`` is a fact when the agent compares two samples: telemetry left out, buckets by bucket."""
    return tuple(
        w.bucket(getattr(obj, attr)) if w.bucket is not None else getattr(obj, attr)
        for attr, w in fields_of(type(obj))
        if not w.telemetry
    )


# ---- the operator reads -------------------------------------------------------------------------------


# A reader of one field's value: (value, key) -> the value typed, or FieldError naming the field from its key
# (read_fields puts the object's path before it). No path is built unless one fails: every report's every
# GPU is read through these.
Reader = Callable[[Any, str], Any]


def _reader(schema: Mapping[str, Any]) -> Reader:
    """The reader of ``schema``'s values, built once per field."""
    kind = schema["type"]
    if kind == "integer":
        minimum, maximum = schema.get("minimum", 0), schema.get("maximum")
        top = maximum if maximum is not None else float("inf")
        bound = f"{minimum}..{maximum}" if maximum is not None else "a non-negative integer"

        def integer(v: Any, key: str) -> int:
            if type(v) is int and minimum <= v <= top:
                return v
            if isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= top:
                return int(v)  # an int subclass
            raise FieldError(f"{key}: expected {bound}, got {v!r}")

        return integer
    if kind == "number":

        def number(v: Any, key: str) -> float:
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise FieldError(f"{key}: expected a non-negative number, got {v!r}")
            return float(v)

        return number
    if kind == "boolean":

        def boolean(v: Any, key: str) -> bool:
            if v is not True and v is not False:
                raise FieldError(f"{key}: expected a boolean, got {v!r}")
            return bool(v)

        return boolean
    if kind == "string" and "enum" in schema:
        allowed = frozenset(schema["enum"])

        def one_of(v: Any, key: str) -> Any:
            if not isinstance(v, str) or v not in allowed:
                raise FieldError(f"{key}: {v!r} is not one of {sorted(allowed)}")
            return v

        return one_of
    if kind == "string":

        def string(v: Any, key: str) -> str:
            if not isinstance(v, str):
                raise FieldError(f"{key}: expected a string, got {v!r}")
            return v

        return string
    if kind == "array":
        item = _reader(schema["items"])

        def array(v: Any, key: str) -> tuple[Any, ...]:
            if not isinstance(v, list | tuple):  # a tuple: the operator's slim cache shares lists so
                raise FieldError(f"{key}: must be a list")
            return tuple(sorted({item(x, f"{key}[{i}]") for i, x in enumerate(v)}))

        return array
    raise TypeError(f"no reader for schema type {kind!r}")


_READERS: dict[type, tuple[tuple[str, str, Reader], ...]] = {}


def _readers_of(cls: type) -> tuple[tuple[str, str, Reader], ...]:
    found = _READERS.get(cls)
    if found is None:
        found = _READERS[cls] = tuple((attr, w.key, _reader(w.schema)) for attr, w in fields_of(cls) if w.read)
    return found


def read_fields(cls: type, m: Mapping[str, Any], *where: str) -> dict[str, Any]:
    """The READ fields of ``cls`` that the report's object ``m`` holds, typed by their schema, by attribute;
    raises FieldError, naming the field under the object's path (``where``'s parts, joined by dots), when
    one is not what the CRD declares."""
    values = {}
    try:
        for attr, key, read in _READERS.get(cls) or _readers_of(cls):
            v = m.get(key)
            if v is not None:
                values[attr] = read(v, key)
    except FieldError as e:
        raise FieldError(f"{'.'.join(where)}.{e}") from None
    return values


def parse_fields(cls: type[T], m: Mapping[str, Any], where: str) -> T:
    """``cls`` from the report's object ``m`` (:func:`read_fields`; an absent field keeps its default)."""
    return cls(**read_fields(cls, m, where))


def read_paths(prefix: str, cls: type) -> tuple[str, ...]:
    """``cls``'s READ fields as the field table spells them (``spec.devices[].nvlink.peers[]``)."""
    return tuple(_path(prefix, w) for _, w in fields_of(cls) if w.read)


def dropped_paths(prefix: str, cls: type) -> dict[str, str]:
    """``cls``'s DROPPED fields, each with why nobody reads it."""
    return {_path(prefix, w): w.dropped for _, w in fields_of(cls) if not w.read}


def _path(prefix: str, w: Wire) -> str:
    return f"{prefix}.{w.key}[]" if w.schema["type"] == "array" else f"{prefix}.{w.key}"
