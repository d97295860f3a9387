"""Copying into a preallocated buffer, the one way the upload and scan paths do it."""

from __future__ import annotations


def copy_into(target: bytearray, offset: int, data: bytes | memoryview) -> None:
    """``target[offset:offset + len(data)] = data``, as one copy: a bytearray's own slice
    assignment first copies ``data`` into a new bytearray (an mmap, at a MiB) and then
    copies that. The view is released at once, so ``target`` may be resized after."""
    with memoryview(target) as view:
        view[offset:offset + len(data)] = data
