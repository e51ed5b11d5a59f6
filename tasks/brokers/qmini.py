"""IBM MQ's qm.ini stanza format: what a set of stanzas is (`QmIni`, as tuning profiles
and the IBM MQ adapter give it), and an editor for the file's text, pure text in, text out.

    Log:
       LogPrimaryFiles=3
       LogType=CIRCULAR

`set_values` changes only the named keys of the named stanzas, appends keys (and stanzas)
that are missing, and keeps comments, blank lines, order and indentation. Applying the
same values twice gives the same text.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

# a stanza's name or a key, as `_STANZA` and `_KEY` read them
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


class QmIni(BaseModel):
    """A qm.ini file and the stanzas (name -> key -> value) to set in it."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(pattern=r"^/[A-Za-z0-9_./-]+$")
    stanzas: dict[str, dict[str, str]]

    @field_validator("stanzas")
    @classmethod
    def _names_and_values(cls, stanzas: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        """What `set_values` can find again: a stanza name or key qm.ini's syntax does not
        match would be added anew on every apply, and a line break in a value would add
        lines of its own."""
        for stanza, keys in stanzas.items():
            if not _NAME.match(stanza):
                raise ValueError(f"stanza {stanza!r}: a letter, then letters and digits "
                                 "(as TuningParameters)")
            for key, value in keys.items():
                if not _NAME.match(key):
                    raise ValueError(f"{stanza}.{key!r}: a letter, then letters and digits")
                if any(ord(c) < 32 or ord(c) == 127 for c in str(value)):
                    raise ValueError(f"{stanza}.{key}: a value on one line, without control "
                                     "characters")
        return stanzas


_STANZA = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9]*):\s*$")
_KEY = re.compile(r"^(?P<indent>\s+)(?P<key>[A-Za-z][A-Za-z0-9]*)\s*=\s*(?P<value>.*?)\s*$")
_COMMENT = re.compile(r"^\s*[#;]")


def read_values(text: str) -> dict[str, dict[str, str]]:
    """Every stanza's keys (the first stanza of a name wins, as for unique stanzas)."""
    values: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if _COMMENT.match(line):
            continue
        if match := _STANZA.match(line):
            current = None if match["name"] in values else values.setdefault(match["name"], {})
        elif (match := _KEY.match(line)) and current is not None:
            current.setdefault(match["key"], match["value"])
    return values


def _stanza_ranges(lines: list[str]) -> dict[str, tuple[int, int]]:
    """name -> (index of the stanza line, index after its last key line), first of each."""
    ranges: dict[str, tuple[int, int]] = {}
    name, start, last = None, 0, 0
    for i, line in enumerate(lines):
        if match := _STANZA.match(line):
            if name and name not in ranges:
                ranges[name] = (start, last + 1)
            name, start, last = match["name"], i, i
        elif name and _KEY.match(line):
            last = i
    if name and name not in ranges:
        ranges[name] = (start, last + 1)
    return ranges


def set_values(text: str, wanted: dict[str, dict[str, str]], indent: str = "   ") -> str:
    lines = text.splitlines()
    for stanza, keys in wanted.items():
        ranges = _stanza_ranges(lines)
        if stanza not in ranges:
            if lines and lines[-1].strip():
                lines.append("")
            lines.append(f"{stanza}:")
            lines.extend(f"{indent}{key}={value}" for key, value in keys.items())
            continue
        start, end = ranges[stanza]
        missing = dict(keys)
        for i in range(start + 1, end):
            match = _KEY.match(lines[i])
            if match and match["key"] in missing:
                lines[i] = f"{match['indent']}{match['key']}={missing.pop(match['key'])}"
        key_indent = next((m["indent"] for i in range(start + 1, end)
                           if (m := _KEY.match(lines[i]))), indent)
        lines[end:end] = [f"{key_indent}{key}={value}" for key, value in missing.items()]
    return "\n".join(lines) + "\n"
