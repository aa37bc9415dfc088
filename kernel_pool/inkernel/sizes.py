"""How large one message a kernel sends may be: a cell's oversized output is made smaller in
the kernel, before the pool's limit would drop it.

Set up by ``messaging``: :func:`cap_messages` is run once, with the baseline.

An ``execute_request`` whose metadata carries ``{"kernel_pool": {"message_cap": N}}`` (the
pool's ``max_iopub_message``) sends no message whose content packs to more than about N
bytes while it runs, its buffers counted: the pool skips a larger message on any socket and
retires the kernel, so an ordinary cell that raises with a 2 MB message, or displays a 1 MB
widget state, would lose its answer; here the content is cut instead: an error keeps the
start and the end of its value and traceback, a display becomes a note of what it held, a
comm message loses its data (nothing reads comms behind the pool), an ``execute_reply``
keeps only the payloads that fit (IPython's ``payload_manager.write_payload`` puts what it
is given there), and a message whose buffers take it over the cap loses them. Anything
else is sent as it is, and the pool's limit applies. A request without a cap sends
everything, as a stock kernel does.
"""

from __future__ import annotations

import json
from typing import Any

_message_cap: list[int | None] = [None]  # the running request's cap, in bytes of packed content
_dropped_buffers = [0]  # bytes of buffers the message being sent goes without (0: none)
_HEADROOM = 8 << 10  # the header, parent header, metadata and signature sent beside it
_NOTE = "[{dropped} characters not kept: one message may hold at most {cap} bytes]"


def cap_messages(kernel: Any) -> None:
    """Wrap the kernel session's JSON packer (it packs every message the kernel sends)."""
    session: Any = getattr(kernel, "session", None)
    pack = getattr(session, "pack", None)
    if pack is None or getattr(pack, "kernel_pool_sized", False):
        return

    def sized_pack(obj: Any) -> Any:
        packed = pack(obj)
        cap = _message_cap[0]
        if cap is None or not isinstance(obj, dict):
            return packed
        if len(packed) <= cap and not _dropped_buffers[0]:
            return packed
        smaller = _smaller(obj, max(cap - _HEADROOM, 1024))
        return packed if smaller is None else pack(smaller)

    vars(sized_pack)["kernel_pool_sized"] = True
    session.pack = sized_pack
    _count_buffers(session, pack)


def _count_buffers(session: Any, pack: Any) -> None:
    """Wrap the session's ``send``: a message whose content and buffers together pack to
    more than the cap goes without its buffers, its content cut as above."""
    send = getattr(session, "send", None)
    if send is None or getattr(send, "kernel_pool_sized", False):
        return

    def sized_send(
        stream: Any, msg_or_type: Any, content: Any = None, parent: Any = None,
        ident: Any = None, buffers: Any = None, *args: Any, **kwargs: Any,
    ) -> Any:  # fmt: skip
        cap = _message_cap[0]
        whole = isinstance(msg_or_type, dict)
        held = buffers or (msg_or_type.get("buffers") if whole else None)
        if cap is None or not held:
            return send(stream, msg_or_type, content, parent, ident, buffers, *args, **kwargs)
        held_bytes = _nbytes(held)
        packed = _packed_size(pack, msg_or_type.get("content") if whole else content)
        if held_bytes + packed <= cap - _HEADROOM:
            return send(stream, msg_or_type, content, parent, ident, buffers, *args, **kwargs)
        if whole:
            msg_or_type = {**msg_or_type, "buffers": []}
        _dropped_buffers[0] = held_bytes
        try:
            return send(stream, msg_or_type, content, parent, ident, None, *args, **kwargs)
        finally:
            _dropped_buffers[0] = 0

    vars(sized_send)["kernel_pool_sized"] = True
    session.send = sized_send


def _nbytes(buffers: Any) -> int:
    total = 0
    for buffer in buffers:
        try:
            total += memoryview(buffer).nbytes
        except TypeError:
            continue  # Session.send refuses it
    return total


def _packed_size(pack: Any, content: Any) -> int:
    try:
        return len(pack(content)) if isinstance(content, dict) else 0
    except (TypeError, ValueError):
        return 0


def start_message_cap(parent: Any) -> None:
    """Take the cap of the request about to run (None: no cap)."""
    metadata = parent.get("metadata") if isinstance(parent, dict) else None
    asked = metadata.get("kernel_pool") if isinstance(metadata, dict) else None
    cap = asked.get("message_cap") if isinstance(asked, dict) else None
    _message_cap[0] = cap if type(cap) is int and cap > 0 else None


def _smaller(content: Any, budget: int) -> Any:
    """``content`` cut to about ``budget`` bytes of JSON, or None when it is not a kind of
    message this knows how to cut."""
    if isinstance(content.get("payload"), list) and content["payload"]:  # an execute_reply
        return {**content, "payload": _payloads_within(content["payload"], budget)}
    if "traceback" in content or "evalue" in content:
        smaller = dict(content)
        smaller["evalue"] = _cut(str(content.get("evalue", "")), budget // 24)
        smaller["traceback"] = _cut_lines(content.get("traceback"), budget // 12)
        return smaller
    if "comm_id" in content:
        return {**content, "data": {}}
    if isinstance(content.get("data"), dict):  # display_data, execute_result, update_display
        data = content["data"]
        held = ", ".join(f"{mime} ({_size(value)} bytes)" for mime, value in data.items())
        if _dropped_buffers[0]:
            held += f", buffers ({_dropped_buffers[0]} bytes)"
        note = f"[display dropped: {held}; one message may hold at most {_message_cap[0]} bytes]"
        return {**content, "data": {"text/plain": note}, "metadata": {}}
    if isinstance(content.get("text"), str):  # a stream message sent past the stream cap
        return {**content, "text": _cut(content["text"], budget // 6)}
    return None


def _payloads_within(payloads: list[Any], budget: int) -> list[Any]:
    """The payloads, in order, that fit in ``budget`` bytes together (the pool reads none)."""
    kept = []
    for payload in payloads:
        try:  # what the kernel's packer makes of it is about as large as its repr
            size = len(json.dumps(payload, default=repr))
        except (TypeError, ValueError, RecursionError):
            continue
        if size > budget:
            continue
        budget -= size
        kept.append(payload)
    return kept


def _cut(text: str, chars: int) -> Any:
    """The start and the end of ``text`` around a note, in about ``chars`` characters (JSON
    may escape a character to 6 bytes: the callers divide their byte budgets by 6 or more)."""
    if len(text) <= chars:
        return text
    half = max(chars // 2 - 100, 0)
    note = _NOTE.format(dropped=len(text) - 2 * half, cap=_message_cap[0])
    return text[:half] + "\n" + note + "\n" + text[len(text) - half :]


def _cut_lines(lines: Any, chars: int) -> Any:
    if not isinstance(lines, list):
        return lines
    per_line = max(chars // min(len(lines), 101), 200)
    cut = [_cut(str(line), per_line) for line in lines[:50]]
    if len(lines) > 100:
        cut.append(f"[{len(lines) - 100} traceback lines not kept]")
    return cut + [_cut(str(line), per_line) for line in lines[max(50, len(lines) - 50) :]]


def _size(value: Any) -> Any:
    try:
        return len(json.dumps(value))
    except (TypeError, ValueError):
        return 0
