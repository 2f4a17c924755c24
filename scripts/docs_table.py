#!/usr/bin/env python3
"""Writes a benchmark's Markdown table into its docs page, between markers.

A page holds a section as

    <!-- NAME:begin -->

    ...

    <!-- NAME:end -->

and a benchmark run with --docs replaces what is between the two markers, so
a new measurement changes that page and nothing else. The markers must be
there already (a missing or doubled marker is an error naming the page):
where a table goes, and the prose around it, is the page's business.

    replace_section(page, name, markdown)  the whole section
    replace_table_row(page, name, row)     one row of the section's table: the
                                           row whose first cell equals row[0],
                                           else a new row at the table's end

Also a command: scripts/docs_table.py PAGE NAME < markdown (the whole section).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERFORMANCE_PAGE = os.path.join(ROOT, "docs", "performance.md")


def _bounds(text, page, name):
    """(start, end): the section's content lies in text[start:end]."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    for marker in (begin, end):
        count = text.count(marker)
        if count != 1:
            raise ValueError(f"{page}: {'no' if count == 0 else str(count) + ' times'} {marker}")
    start, stop = text.index(begin) + len(begin), text.index(end)
    if stop < start:
        raise ValueError(f"{page}: {end} before {begin}")
    return start, stop


def section(page, name):
    """The section's content, without the blank lines around it."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    start, stop = _bounds(text, page, name)
    return text[start:stop].strip("\n")


def replace_section(page, name, markdown):
    """Puts markdown between the section's markers (one blank line each side)."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    start, stop = _bounds(text, page, name)
    text = text[:start] + "\n\n" + markdown.strip("\n") + "\n\n" + text[stop:]
    with open(page, "w", encoding="utf-8") as f:
        f.write(text)


def table_row(cells):
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def replace_table_row(page, name, row):
    """Replaces the row of the section's table whose first cell is row[0], or
    appends it after the table's last row. The section must hold a table."""
    lines = section(page, name).split("\n")
    rows = [i for i, line in enumerate(lines) if line.startswith("|")]
    if len(rows) < 2:
        raise ValueError(f"{page}: section {name} holds no table to put a row in")
    new = table_row(row)
    for i in rows[2:]:  # after the header and its rule
        if lines[i].strip("|").split("|")[0].strip() == str(row[0]).strip():
            lines[i] = new
            break
    else:
        lines.insert(rows[-1] + 1, new)
    replace_section(page, name, "\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    replace_section(sys.argv[1], sys.argv[2], sys.stdin.read())
    print(f"written: {sys.argv[1]} ({sys.argv[2]})")
