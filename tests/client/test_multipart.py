"""The streaming multipart body, parsed back with the parser the registry itself uses."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from python_multipart.multipart import MultipartParser, parse_options_header

from loraplane.client import InvalidSource
from loraplane.client.multipart import FieldPart, FilePart, MultipartBody

Part = tuple[dict[bytes, bytes], bytes]


def parse(body: bytes, boundary: str, feed_sizes: Iterator[int]) -> list[Part]:
    """Every part as (headers, payload), feeding the parser in uneven pieces."""
    parts: list[Part] = []
    state: dict[str, bytes] = {"field": b"", "value": b""}
    headers: dict[bytes, bytes] = {}
    data = bytearray()

    def part_begin() -> None:
        headers.clear()
        data.clear()

    def header_field(buf: bytes, start: int, end: int) -> None:
        state["field"] += buf[start:end]

    def header_value(buf: bytes, start: int, end: int) -> None:
        state["value"] += buf[start:end]

    def header_end() -> None:
        headers[state["field"].lower()] = state["value"]
        state["field"] = state["value"] = b""

    def part_data(buf: bytes, start: int, end: int) -> None:
        data.extend(buf[start:end])

    def part_end() -> None:
        parts.append((dict(headers), bytes(data)))

    parser = MultipartParser(boundary.encode(), callbacks={
        "on_part_begin": part_begin, "on_header_field": header_field,
        "on_header_value": header_value, "on_header_end": header_end,
        "on_part_data": part_data, "on_part_end": part_end,
    })
    offset = 0
    while offset < len(body):
        size = next(feed_sizes)
        parser.write(body[offset:offset + size])
        offset += size
    parser.finalize()
    return parts


def disposition(headers: dict[bytes, bytes]) -> dict[bytes, bytes]:
    kind, params = parse_options_header(headers[b"content-disposition"])
    assert kind == b"form-data"
    return params


def write(path: Path, size: int, seed: int) -> bytes:
    payload = random.Random(seed).randbytes(size)
    path.write_bytes(payload)
    return payload


def uneven(seed: int) -> Iterator[int]:
    rng = random.Random(seed)
    while True:
        yield rng.choice((1, 2, 7, 64, 1000, 65536))


@pytest.mark.parametrize("chunk_size", [1, 7, 4096, 1 << 20])
def test_body_parses_back_to_the_same_fields_and_bytes(tmp_path: Path, chunk_size: int) -> None:
    config = write(tmp_path / "adapter_config.json", 811, seed=1)
    # Holds the boundary's own prefix and CRLFs, which must not end the part early.
    weights = b"\r\n--loraplane-\r\n" + write(tmp_path / "w.bin", 300_000, seed=2)
    (tmp_path / "adapter_model.safetensors").write_bytes(weights)
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    body = MultipartBody(
        [FieldPart("aliases", "live,canary"), FieldPart("notes", "naïve ✓ \"quoted\"\r\nline")],
        [FilePart.of("files", tmp_path / "adapter_config.json"),
         FilePart.of("files", tmp_path / "adapter_model.safetensors"),
         FilePart.of("files", empty, content_type="application/x-tar")],
        chunk_size=chunk_size)
    raw = b"".join(body)

    assert len(raw) == body.content_length
    assert body.headers["Content-Length"] == str(len(raw))
    _, params = parse_options_header(body.content_type.encode())
    parts = parse(raw, params[b"boundary"].decode(), uneven(chunk_size))

    assert [disposition(h)[b"name"] for h, _ in parts] == [b"aliases", b"notes"] + [b"files"] * 3
    assert parts[0][1] == b"live,canary"
    assert parts[1][1].decode() == "naïve ✓ \"quoted\"\r\nline"
    assert [disposition(h).get(b"filename") for h, _ in parts[2:]] == [
        b"adapter_config.json", b"adapter_model.safetensors", b"empty.tar"]
    assert [p for _, p in parts[2:]] == [config, weights, b""]
    assert parts[2][0][b"content-type"] == b"application/octet-stream"
    assert parts[4][0][b"content-type"] == b"application/x-tar"


def test_file_data_is_streamed_in_bounded_chunks(tmp_path: Path) -> None:
    write(tmp_path / "big.bin", 5 * 65536 + 3, seed=3)
    body = MultipartBody([], [FilePart.of("files", tmp_path / "big.bin")], chunk_size=65536)
    chunks = list(body)
    assert max(len(c) for c in chunks) <= 65536
    assert sum(len(c) for c in chunks) == body.content_length
    # Iterable more than once (a retried request sends the same bytes).
    assert b"".join(body) == b"".join(chunks)


def test_names_that_would_break_the_header_are_escaped(tmp_path: Path) -> None:
    source = tmp_path / "x.zip"
    source.write_bytes(b"PK")
    body = MultipartBody([], [FilePart.of("files", source, filename='a"b\r\nX-Evil: 1.zip')])
    raw = b"".join(body)
    parts = parse(raw, body.boundary, iter(lambda: 16, None))
    headers, payload = parts[0]
    assert set(headers) == {b"content-disposition", b"content-type"}
    assert disposition(headers)[b"filename"] == b"a%22b%0D%0AX-Evil: 1.zip"
    assert payload == b"PK"


def test_a_file_that_shrinks_during_the_upload_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "adapter_model.safetensors"
    write(source, 10_000, seed=4)
    body = MultipartBody([], [FilePart.of("files", source)], chunk_size=1000)
    os.truncate(source, 5000)
    with pytest.raises(InvalidSource) as caught:
        b"".join(body)
    assert caught.value.code == "file_changed"


def test_a_file_that_grows_during_the_upload_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "adapter_model.safetensors"
    write(source, 10_000, seed=5)
    body = MultipartBody([], [FilePart.of("files", source)], chunk_size=1000)
    with source.open("ab") as handle:
        handle.write(b"more")
    with pytest.raises(InvalidSource, match="changed while it was being uploaded"):
        b"".join(body)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSource, match="cannot read"):
        FilePart.of("files", tmp_path / "absent.safetensors")


def test_httpx_sends_it_with_content_length_not_chunked(tmp_path: Path) -> None:
    payload = write(tmp_path / "adapter_config.json", 70_000, seed=6)
    body = MultipartBody([FieldPart("aliases", "live")],
                         [FilePart.of("files", tmp_path / "adapter_config.json")],
                         chunk_size=4096)
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        request.read()
        seen.append(request)
        return httpx.Response(201, json={})

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        client.post("http://registry/v1/adapters/a/versions", content=body,
                    headers=body.headers)
    [request] = seen
    assert request.headers["content-length"] == str(body.content_length)
    assert "transfer-encoding" not in request.headers
    assert len(request.content) == body.content_length
    assert payload in request.content
