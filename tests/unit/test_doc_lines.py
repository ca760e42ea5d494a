"""Every line of the documentation reads in an editor: prose, lists and code at most 120 characters, table rows at
most 200 (a table whose cells run longer is written as a list)."""
import glob
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCUMENTS = sorted([os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md"))]
                   + ["README.md", os.path.join("scripts", "README.md")])
PROSE, TABLE = 120, 200


def too_long(text):
    """``[(line number, characters)]`` of the lines of ``text`` past their limit."""
    return [(number, len(line)) for number, line in enumerate(text.split("\n"), 1)
            if len(line) > (TABLE if line.startswith("|") else PROSE)]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_line_of_the_document_fits(document):
    with open(os.path.join(REPO, document), encoding="utf-8") as handle:
        long = too_long(handle.read())
    assert not long, ["%s:%d: %d characters" % (document, number, size) for number, size in long]


def test_a_long_table_row_and_a_long_line_of_prose_are_found():
    row = "| " + "cell | " * 28 + "|"
    text = "\n".join(["x" * PROSE, "x" * (PROSE + 1), row, row.replace("cell", "cells"), "  " + row])
    assert len(row) <= TABLE < len(row.replace("cell", "cells"))
    assert [number for number, _ in too_long(text)] == [2, 4, 5]
    assert "README.md" in DOCUMENTS and os.path.join("docs", "synccheck.md") in DOCUMENTS
