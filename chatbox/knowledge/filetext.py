"""Text out of uploaded files: plain text, Markdown, HTML and PDF, page by page.

(Not to be confused with extraction.py, which pulls facts out of conversations.)
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePath

from chatbox.knowledge.errors import EmptyFile, EncryptedFile, FileTooLarge, UnsupportedFile

_TEXT_EXT = {
    ".txt": "text/plain",
    ".text": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".html": "text/html",
    ".htm": "text/html",
    ".pdf": "application/pdf",
}


@dataclass(frozen=True)
class Extracted:
    """A file's text: its kind, its non-empty pages, and (PDFs) how many pages it has."""

    mime: str
    pages: list[tuple[int | None, str]]  # (page number or None, text)
    page_count: int | None


def detect_type(filename: str, content_type: str | None, data: bytes) -> str:
    """The document's kind (a MIME type), from its bytes first, then name and declared type."""
    if data.startswith(b"%PDF-"):
        return "application/pdf"
    ext = PurePath(filename or "").suffix.lower()
    if ext in _TEXT_EXT:
        return _TEXT_EXT[ext]
    declared = (content_type or "").split(";")[0].strip().lower()
    if declared in ("text/html", "application/xhtml+xml"):
        return "text/html"
    if declared == "text/markdown":
        return declared
    head = data[:512].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html")):
        return "text/html"
    if declared.startswith("text/") or declared in ("", "application/octet-stream"):
        return "text/plain"
    raise UnsupportedFile(
        f"{filename or 'the file'} is {declared}, which is not a document "
        "chatbox can read (plain text, Markdown, HTML or PDF)"
    )


def decode_text(data: bytes, name: str) -> str:
    """Bytes of a text file as str (UTF-8, or UTF-16 with a BOM); binary is refused."""
    if b"\x00" in data[:8192] and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise UnsupportedFile(f"{name} is not text (it looks like a binary file)")
    for encoding in ("utf-8-sig", "utf-16"):
        if encoding == "utf-16" and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
            continue
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    raise UnsupportedFile(f"{name} is not UTF-8 text")


class _HTMLText(HTMLParser):
    _SKIP = {"script", "style", "noscript", "template", "svg", "head"}
    _BLOCK = {
        "p",
        "div",
        "br",
        "li",
        "tr",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "section",
        "article",
        "pre",
        "blockquote",
        "table",
        "ul",
        "ol",
        "title",
        "header",
        "footer",
    }

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self._skipping += 1
        elif tag in self._BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self._skipping = max(0, self._skipping - 1)
        elif tag in self._BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def html_text(html: str) -> str:
    """The visible text of an HTML page, blocks separated by blank lines."""
    parser = _HTMLText()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts)


def pdf_pages(
    data: bytes, name: str, max_pages: int | None = None
) -> tuple[list[tuple[int | None, str]], int]:
    """The text of each page; FileTooLarge, before any text is extracted, past max_pages."""
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise EncryptedFile(
                f"{name} is encrypted (password-protected); upload an unprotected copy"
            )
        count = len(reader.pages)
        if max_pages is not None and count > max_pages:
            raise FileTooLarge(f"{name} has {count:,} pages; the limit is {max_pages:,} pages")
        pages: list[tuple[int | None, str]] = [
            (i + 1, page.extract_text() or "") for i, page in enumerate(reader.pages)
        ]
    except (EncryptedFile, FileTooLarge):
        raise
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        if "encrypt" in str(exc).lower() or "password" in str(exc).lower():
            raise EncryptedFile(f"{name} is encrypted (password-protected)") from exc
        raise UnsupportedFile(f"{name} is not a readable PDF ({exc})") from exc
    except Exception as exc:  # pypdf raises many kinds on damaged files
        raise UnsupportedFile(f"{name} is not a readable PDF") from exc
    return pages, len(pages)


def normalize(text: str) -> str:
    """Collapse runs of spaces; keep paragraph breaks."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    text = re.sub(r"[ \t\f\v\u00a0]+", " ", text)
    text = re.sub(r" *\n *", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def extract(
    filename: str, content_type: str | None, data: bytes, max_pages: int | None = None
) -> Extracted:
    """Text of a file, page by page (one "page" for non-PDFs). Raises RejectedFile kinds."""
    name = filename or "the file"
    if not data.strip():
        raise EmptyFile(f"{name} is empty")
    mime = detect_type(filename, content_type, data)
    if mime == "application/pdf":
        raw_pages, count = pdf_pages(data, name, max_pages)
        pages = [(n, normalize(t)) for n, t in raw_pages]
    else:
        text = decode_text(data, name)
        if mime == "text/html":
            text = html_text(text)
        pages, count = [(None, normalize(text))], None
    pages = [(n, t) for n, t in pages if t]
    if not pages:
        detail = " (a scanned PDF has only images)" if mime == "application/pdf" else ""
        raise EmptyFile(f"{name} has no text to read{detail}")
    return Extracted(mime, pages, count)
