"""CRC-32C (Castagnoli), the checksum ferrotrain seals its JSON files with (api/src/checksummed.rs:
the `crc32c` crate). Table-driven, standard library only: the files it checks are small."""

_POLY = 0x82F63B78


def _table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
