"""English Wikipedia articles from the extract that the PyPI ``gensim`` wheel ships
(``gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2``; installed, or
``poskit data fetch wiki``).  Each main-namespace, non-redirect page is a document keyed by its title; its wiki
markup is reduced to plain text by :func:`plain_text` (templates, tables, references, comments, files and
categories removed; links replaced by their text; bold/italic quotes and heading ``=`` marks removed)."""
from __future__ import annotations

import bz2
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator

from .base import Document, Source
from .locations import find_files

__all__ = ["plain_text", "read_articles", "SOURCE"]

FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


def _drop_nested(text: str, open_: str, close: str) -> str:
    """Remove every (possibly nested) ``open_ ... close`` span: templates and tables nest, regexes cannot."""
    out, depth, i = [], 0, 0
    while i < len(text):
        if text.startswith(open_, i):
            depth, i = depth + 1, i + len(open_)
        elif depth and text.startswith(close, i):
            depth, i = depth - 1, i + len(close)
        else:
            if not depth:
                out.append(text[i])
            i += 1
    return "".join(out)


def plain_text(markup: str) -> str:
    text = re.sub(r"<!--.*?-->", "", markup, flags=re.S)
    text = re.sub(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", "", text, flags=re.S)
    text = _drop_nested(_drop_nested(text, "{{", "}}"), "{|", "|}")
    text = re.sub(r"\[\[(?:File|Image|Category):(?:[^\[\]]|\[\[[^\]]*\]\])*\]\]", "", text, flags=re.I)
    text = re.sub(r"\[\[(?:[^|\]]*\|)?([^\]]*)\]\]", r"\1", text)  # [[target|label]] -> label
    text = re.sub(r"\[https?://\S+ ([^\]]*)\]", r"\1", text)  # [url label] -> label
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"(?m)^(=+)\s*(.*?)\s*\1\s*$", r"\2", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def read_articles(path: Path) -> Iterator[Document]:
    with bz2.open(path, "rb") as f:
        for _, elem in ET.iterparse(f):
            if not elem.tag.endswith("}page"):
                continue
            ns = "{" + elem.tag[1:].split("}")[0] + "}"
            title = elem.findtext(f"{ns}title") or ""
            body = elem.findtext(f"{ns}revision/{ns}text") or ""
            if elem.findtext(f"{ns}ns") == "0" and elem.find(f"{ns}redirect") is None:
                text = plain_text(body)
                if text:
                    yield title, text
            elem.clear()


SOURCE = Source(f"PyPI gensim wheel: gensim/test/test_data/{FILE}", "text",
                lambda: find_files("wiki", f"test/test_data/{FILE}", package="gensim", fetch="wiki"), read_articles)
