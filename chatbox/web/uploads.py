"""Reading an upload: the multipart body streamed with a hard cap enforced while reading.

The upload routes turn Litestar's own body cap off (it is fixed when the route is declared,
and the upload limit is a setting), so this reader is the cap: it counts the bytes as they
arrive and refuses (413) as soon as the body passes the file limit plus a small allowance
for the form around the file, whatever Content-Length says or whether there is one at all
(a chunked body). Nothing is buffered beyond that cap, and nothing is parsed twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from litestar import Request
from multipart import MultipartError, MultipartSegment, ParserLimitReached, PushMultipartParser

from chatbox.chat import InvalidInput
from chatbox.knowledge import FileTooLarge

FORM_ALLOWANCE = 64 * 1024  # boundaries, part headers and the form's small fields
MAX_PARTS = 16  # the upload forms send a file and a few fields
NOT_MULTIPART = "send the file as multipart/form-data in a field named 'file'"


@dataclass(frozen=True)
class UploadedFile:
    filename: str
    content_type: str | None
    data: bytes


@dataclass
class UploadForm:
    """The file (the first part named `file` with a filename) and the text fields."""

    file: UploadedFile | None = None
    fields: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> str:
        return self.fields.get(name, "")


async def read_upload(request: Request[Any, Any, Any], max_file_bytes: int) -> UploadForm:
    """Stream and parse a multipart upload; FileTooLarge (413) once it passes the cap."""
    cap = max_file_bytes + FORM_ALLOWANCE
    declared = request.content_length
    if declared is not None and declared > cap:  # refuse before reading anything
        raise FileTooLarge(
            f"the upload is {declared:,} bytes; the limit is {max_file_bytes:,} bytes"
        )
    mime, options = request.content_type
    boundary = options.get("boundary")
    if mime != "multipart/form-data" or not boundary:
        raise InvalidInput(NOT_MULTIPART, "file")
    form = UploadForm()
    segment: MultipartSegment | None = None
    body = bytearray()
    received = 0
    try:
        with PushMultipartParser(boundary, max_segment_count=MAX_PARTS) as parser:
            async for chunk in request.stream():
                received += len(chunk)
                if received > cap:
                    raise FileTooLarge(
                        f"the upload is over {cap:,} bytes; the limit is {max_file_bytes:,} bytes"
                    )
                for event in parser.parse(chunk) if chunk else ():
                    if isinstance(event, MultipartSegment):
                        segment, body = event, bytearray()
                    elif event:
                        body.extend(event)
                        if segment is not None and segment.filename and len(body) > max_file_bytes:
                            raise FileTooLarge(
                                f"{segment.filename} is over "
                                f"{max_file_bytes:,} bytes; the limit is "
                                f"{max_file_bytes:,} bytes"
                            )
                    elif segment is not None:  # the end of a part
                        _keep(form, segment, bytes(body))
                        segment, body = None, bytearray()
                if parser.closed:  # past the final boundary: the rest is epilogue
                    break
    except ParserLimitReached as exc:
        raise InvalidInput(
            f"the upload form has too many parts (the limit is {MAX_PARTS}) "
            "or an oversized part header",
            "file",
        ) from exc
    except MultipartError as exc:
        raise InvalidInput(f"the upload is not valid multipart/form-data ({exc})", "file") from exc
    return form


def _keep(form: UploadForm, segment: MultipartSegment, data: bytes) -> None:
    if segment.filename:
        if segment.name == "file" and form.file is None:
            form.file = UploadedFile(segment.filename, segment.content_type, data)
    elif segment.name not in form.fields:
        form.fields[segment.name] = data.decode(segment.charset or "utf-8", errors="replace")
