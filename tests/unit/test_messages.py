"""Decoding kernel messages: what jupyter_client's Session signs, the pool reads back."""

from __future__ import annotations

import pytest
from jupyter_client.session import Session

from kernel_pool.messages import decode


def _frames(session: Session, *, buffers: list[bytes] | None = None) -> list[bytes]:
    msg = session.msg("stream", {"name": "stdout", "text": "héllo\n"}, parent={"msg_id": "p1"})
    frames = session.serialize(msg)
    return [b"topic", *frames, *(buffers or [])]


def test_decodes_what_a_session_signed() -> None:
    session = Session(key=b"secret")
    msg = decode(_frames(session, buffers=[b"\x00\x01"]), session.auth)
    assert msg["header"]["msg_type"] == msg["msg_type"] == "stream"
    assert msg["parent_header"]["msg_id"] == "p1"
    assert msg["content"] == {"name": "stdout", "text": "héllo\n"}
    assert msg["buffers"] == [b"\x00\x01"]


def test_a_tampered_or_unsigned_message_is_refused() -> None:
    session = Session(key=b"secret")
    frames = _frames(session)
    tampered = [*frames[:-1], frames[-1].replace(b"stdout", b"stderr")]
    with pytest.raises(ValueError, match="signature"):
        decode(tampered, session.auth)
    unsigned = _frames(Session(key=b""))
    with pytest.raises(ValueError, match="signature"):
        decode(unsigned, session.auth)


def test_malformed_messages_are_refused() -> None:
    session = Session(key=b"secret")
    with pytest.raises(ValueError, match="delimiter"):
        decode([b"no", b"delimiter"], session.auth)
    with pytest.raises(ValueError, match="malformed"):
        decode([b"<IDS|MSG>", b"sig", b"{}"], session.auth)
