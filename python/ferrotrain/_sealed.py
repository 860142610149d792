"""JSON files sealed with their own CRC-32C, as api/src/checksummed.rs writes and reads them: the
writer puts a field holding "00000000" into the object, writes it, and replaces those zeros with
the CRC-32C (8 hex digits) of the bytes written; the reader puts the zeros back and compares."""

import json
import os

from ._crc32c import crc32c

CRC_FIELD = "crc32c"
_PLACEHOLDER = "00000000"


def _field_text(field, value):
    return f'"{field}": "{value}"'.encode()


def seal(obj: dict, field: str = CRC_FIELD) -> bytes:
    """Pretty JSON of `obj` with its CRC-32C in `field`."""
    obj = dict(obj)
    obj[field] = _PLACEHOLDER
    data = json.dumps(obj, indent=2, allow_nan=False).encode()
    crc = f"{crc32c(data):08x}"
    return data.replace(_field_text(field, _PLACEHOLDER), _field_text(field, crc), 1)


def open_sealed(data: bytes, field: str = CRC_FIELD) -> dict:
    """The object in `data`, once its CRC-32C matches (a file without the field is taken as it
    is); ValueError says what is wrong."""
    obj = json.loads(data)
    recorded = obj.get(field)
    if recorded is None:
        return obj
    if not isinstance(recorded, str) or len(recorded) != len(_PLACEHOLDER):
        raise ValueError(f"{field} is not a CRC: {recorded!r}")
    text = _field_text(field, recorded)
    at = data.find(text)
    if at < 0:
        raise ValueError(f"{field} is not where it was written")
    zeroed = data[:at] + _field_text(field, _PLACEHOLDER) + data[at + len(text):]
    actual = f"{crc32c(zeroed):08x}"
    if actual != recorded:
        raise ValueError(f"does not match its CRC-32C ({actual}, the file says {recorded}): the file is damaged")
    return obj


def write_atomically(path: str, data: bytes) -> None:
    """`data` at `path`, whole or not at all: a temporary file beside it, then a rename."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
