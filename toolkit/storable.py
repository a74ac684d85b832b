"""What a client sends to the database as text or JSON is made storable before it is sent.

PostgreSQL's text and jsonb cannot hold NUL (U+0000): the server refuses the whole
statement. A lone surrogate (U+D800-U+DFFF outside a pair, e.g. from bytes decoded with
Python's surrogateescape) has no UTF-8 form: the driver fails before sending. Either came
back as a raw driver error, and a nack that failed that way left its item leased. Every
client call of every kind passes its text through this module, by one of two rules:

- Text the caller chose and reads back (a title, header keys and values, the worker name,
  a payload given as str) is sent exactly as given or refused with a one-line UsageError
  naming the field and the position. It is never altered silently. Headers must be JSON
  values that come back as they went (dict with str keys, list, str, int, finite float,
  bool, None): NaN, Infinity, sets, tuples and other objects are refused, not converted.
- Diagnostic text (a nack's error reason, a handler's exception) explains a failure and
  must never cause one: NUL and lone surrogates become U+FFFD, the text is cut to
  DIAGNOSTIC_TEXT_LIMIT characters (SQL Server's last_error holds 4,000 UTF-16 units),
  and an object whose str() fails is named by its type.

NUL inside a payload is data like any other byte (payloads are bytea / varbinary).
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from typing import Any

from queuectl.errors import UsageError

DIAGNOSTIC_TEXT_LIMIT = 2000
REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# json.dumps writes NUL as \u0000 and a surrogate as \udXXX (ensure_ascii); a match may also
# be an escaped backslash before such text, or an emoji's pair, which the walk finds harmless.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")

SHOWN_LIMIT = 80
_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxstring = _REPR.maxother = 40
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdict = 3


def shown(value: object) -> str:
    """A value as an error message shows it: its repr, shortened to SHOWN_LIMIT characters
    (a 5 MB argument does not make a 5 MB message)."""
    text = _REPR.repr(value)
    return text if len(text) <= SHOWN_LIMIT else text[:SHOWN_LIMIT - 3] + "..."


def _refuse_unstorable(text: str, what: str) -> None:
    found = _UNSTORABLE.search(text)
    if found is None:
        return
    char = found.group()
    if char == "\x00":
        reason = "a NUL character (U+0000) at position {}, which the database cannot store"
    else:
        reason = f"a lone surrogate (U+{ord(char):04X}) at position {{}}, which has no UTF-8 form"
    raise UsageError(f"{what} contains {reason.format(found.start())}")


def stored_text(value: object, what: str) -> str | None:
    """A text the caller chose (title, worker name), sent as given, or UsageError naming `what`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f"{what} must be text (str) or None, not {type(value).__name__}")
    _refuse_unstorable(value, what)
    return value


def payload_bytes(payload: object, what: str = "payload") -> bytes:
    """A payload as the bytes stored: bytes-like as is, str as UTF-8 (NUL is fine in either)."""
    if isinstance(payload, str):
        try:
            return payload.encode("utf-8")
        except UnicodeEncodeError:
            _refuse_unstorable(payload, what)
            raise
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    raise UsageError(f"{what} must be bytes or str, not {type(payload).__name__}")


def headers_json(headers: object, what: str = "headers") -> str | None:
    """Headers as the JSON text sent to the server, or UsageError naming the offending entry.

    The usual case costs one dumps and one loads in C: headers whose JSON reads back equal,
    with no NUL or surrogate escape in it, are fine. Anything else is walked in Python,
    which names what is wrong (about 4x the time of the dumps).
    """
    if headers is None:
        return None
    if not isinstance(headers, dict):
        raise UsageError(f"{what} must be a dict of JSON values or None, not {type(headers).__name__}")
    try:
        text = json.dumps(headers, allow_nan=False)
        if json.loads(text) == headers and not _SUSPECT_ESCAPE.search(text):
            return text
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        _check_json(headers, what)
        return json.dumps(headers, allow_nan=False)
    except RecursionError:
        raise UsageError(f"{what} nest too deeply to be written as JSON") from None
    except ValueError as exc:  # an int longer than Python writes out (sys.get_int_max_str_digits)
        raise UsageError(f"{what}: {exc}") from None



def _check_json(value: Any, path: str) -> None:
    if isinstance(value, str):
        _refuse_unstorable(value, path)
    elif value is None or isinstance(value, int):  # bool is an int
        return
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise UsageError(f"{path} is {value!r}: JSON has no NaN or Infinity")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise UsageError(f"{path} has a key of type {type(key).__name__} ({shown(key)}): JSON object keys are text")
            _refuse_unstorable(key, f"key {shown(key)} of {path}")
            _check_json(item, f"{path}[{shown(key)}]")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{path}[{i}]")
    else:
        raise UsageError(f"{path} is a {type(value).__name__}, which is not a JSON value "
                         "(use dict, list, str, int, float, bool or None)")


def diagnostic_text(value: object, limit: int = DIAGNOSTIC_TEXT_LIMIT) -> str | None:
    """Text that explains a failure (a nack's error), always storable: never raises.

    An exception reads "TypeName: message". NUL and lone surrogates become U+FFFD; the text
    is cut to `limit` characters.
    """
    if value is None:
        return None
    try:
        text = f"{type(value).__name__}: {value}" if isinstance(value, BaseException) else str(value)
    except Exception:
        text = f"<{type(value).__name__} that cannot be shown as text>"
    return _UNSTORABLE.sub(REPLACEMENT, text[:limit])
