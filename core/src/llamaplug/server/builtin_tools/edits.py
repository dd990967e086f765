"""edit_file's replacements, as llama-server's: each old_text unique and matched against the original content
(exactly, else after the fuzzy normalisation below: trailing blanks, typographic quotes, dashes and spaces),
edits never overlapping; under a fuzzy match the lines no edit touches are kept as they were."""

from __future__ import annotations

import re
from typing import NamedTuple

# llama-server's normalize_line_for_fuzzy_match: smart quotes, dashes, the minus sign and special spaces to ASCII
_FUZZY = str.maketrans({**dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
                        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
                        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
                        **dict.fromkeys("\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f"
                                        "\u3000", " ")})


class Edit(NamedTuple):
    old_text: str
    new_text: str


class _Match(NamedTuple):
    edit: int
    start: int
    length: int
    new_text: str


def fuzzy(content: str) -> str:
    """Each line without its trailing spaces, tabs and CRs, its typographic characters made ASCII; lines kept."""
    return "\n".join(line.rstrip(" \t\r").translate(_FUZZY) for line in content.split("\n"))


def apply_edits(original: str, edits: list[Edit], path: str) -> str | dict[str, str]:
    """The edited content, or llama-server's {"error": ...} naming the edit that cannot apply."""
    loose = None
    any_fuzzy = False
    for i, e in enumerate(edits):
        if e.old_text in original:
            continue
        loose = loose if loose is not None else fuzzy(original)
        if fuzzy(e.old_text) not in loose:
            return {"error": f"could not find edits[{i}].old_text in {path}, it must match the file's current "
                             "content exactly"}
        any_fuzzy = True
    loose = loose if loose is not None else fuzzy(original)
    base = loose if any_fuzzy else original
    matched = []
    for i, e in enumerate(edits):
        needle = fuzzy(e.old_text) if any_fuzzy else e.old_text
        # uniqueness on the normalised text always: a duplicate that differs only in blanks still counts
        count = _count(loose, fuzzy(e.old_text))
        if count > 1:
            return {"error": f"found {count} occurrences of edits[{i}].old_text in {path}, it must be unique"}
        matched.append(_Match(i, base.find(needle), len(needle), e.new_text))
    matched.sort(key=lambda m: m.start)
    for a, b in zip(matched, matched[1:]):
        if a.start + a.length > b.start:
            return {"error": f"edits[{a.edit}] and edits[{b.edit}] overlap in {path}; merge them into one edit or "
                             "target disjoint regions"}
    return _keeping_lines(original, base, matched) if any_fuzzy else _replace(base, matched, 0)


def _count(content: str, needle: str) -> int:
    return content.count(needle) if needle else 0


def _replace(content: str, matched: list[_Match], offset: int) -> str:
    for m in reversed(matched):
        at = m.start - offset
        content = content[:at] + m.new_text + content[at + m.length:]
    return content


def _spans(content: str) -> list[tuple[int, int]]:
    spans, at = [], 0
    for line in re.findall(r"[^\n]*\n|[^\n]+$", content):
        spans.append((at, at + len(line)))
        at += len(line)
    return spans


def _keeping_lines(original: str, base: str, matched: list[_Match]) -> str:
    """The replacements made on the normalised text, the lines none touches taken from the original."""
    originals = re.findall(r"[^\n]*\n|[^\n]+$", original)
    spans = _spans(base)
    groups: list[list] = []  # [first line, end line (exclusive), matches]
    for m in matched:
        first = next((i for i, (s, e) in enumerate(spans) if s <= m.start < e), 0)
        last = first
        while last < len(spans) and spans[last][1] < m.start + m.length:
            last += 1
        end = min(last, len(spans) - 1) + 1
        if groups and first < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], end)
            groups[-1][2].append(m)
        else:
            groups.append([first, end, [m]])
    out, kept = [], 0
    for first, end, group in groups:
        out += originals[kept:first]
        start = spans[first][0]
        out.append(_replace(base[start:spans[end - 1][1]], group, start))
        kept = end
    out += originals[kept:]
    return "".join(out)
