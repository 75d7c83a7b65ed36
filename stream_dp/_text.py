"""Decoding a user's text file with an error that says where it is not UTF-8."""

from __future__ import annotations


def decode_utf8(raw: bytes, what: str) -> str:
    """``raw`` as UTF-8 text; ``ValueError`` naming ``what`` (e.g. ``"domain file 'd.toml'"``),
    the offending byte and its line (1-based).

    >>> decode_utf8(b"a = 1", "file 'x'")
    'a = 1'
    >>> decode_utf8(b"a = 1\\nb = '\\xed'", "file 'x'")
    Traceback (most recent call last):
    ...
    ValueError: file 'x' is not valid UTF-8 text (byte 0xed on line 2)
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ValueError(f"{what} is not valid UTF-8 text (byte 0x{raw[exc.start]:02x} on line "
                         f"{line})") from None
