"""The bearer gate's two exact details, and scrubbing the worker's secrets."""

from __future__ import annotations

import hmac
import json

import pytest

from kernel_worker.errors import (
    BadRequest,
    CellTimedOut,
    EnvironmentFailed,
    KernelCrashed,
    PayloadTooLarge,
    Unauthorized,
    UpstreamFailed,
    WorkerBusy,
    WorkerError,
    error_response,
    status_for,
)
from kernel_worker.http.auth import SECRET_ENV_VARS, check_bearer, scrub_secrets

MALFORMED = "Missing or malformed Authorization header (expected Bearer token)"
WRONG = "Invalid worker token"


@pytest.mark.parametrize("token", [None, "", "   "])
def test_no_token_means_no_gate(token: str | None) -> None:
    check_bearer(None, token)
    check_bearer("garbage", token)


def test_right_token() -> None:
    check_bearer("Bearer s3cret", "s3cret")


def test_configured_token_is_stripped_like_the_reference() -> None:
    check_bearer("Bearer s3cret", "  s3cret\n")


@pytest.mark.parametrize(
    "header", [None, "", "s3cret", "bearer s3cret", "Bearer", "Basic s3cret", " Bearer s3cret"]
)
def test_missing_or_malformed(header: str | None) -> None:
    with pytest.raises(Unauthorized) as info:
        check_bearer(header, "s3cret")
    assert info.value.detail == MALFORMED


@pytest.mark.parametrize(
    "header", ["Bearer ", "Bearer wrong", "Bearer s3cret ", "Bearer  s3cret", "Bearer sécret"]
)
def test_wrong_token(header: str) -> None:
    with pytest.raises(Unauthorized) as info:
        check_bearer(header, "s3cret")
    assert info.value.detail == WRONG


def test_non_ascii_token_compares_as_utf8() -> None:
    check_bearer("Bearer sécret", "sécret")
    with pytest.raises(Unauthorized):
        check_bearer("Bearer s\udcffcret", "sécret")


def test_comparison_is_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    with pytest.raises(Unauthorized):
        check_bearer("Bearer nope", "s3cret")
    assert seen == [(b"nope", b"s3cret")]


def test_unauthorized_response_shape() -> None:
    response = error_response(Unauthorized(WRONG))
    assert response.status_code == 401
    assert json.loads(bytes(response.body)) == {"detail": WRONG}
    assert "www-authenticate" not in response.headers


def test_secret_names() -> None:
    assert set(SECRET_ENV_VARS) == {
        "STRATA_WORKER_TOKEN",
        "STRATA_WORKER_CONNECT_TOKEN",
        "STRATA_NOTEBOOK_CREDENTIALS",
        "STRATA_NOTEBOOK_MOUNT_CREDENTIALS",
        "STRATA_PROXY_TOKEN",
        "STRATA_NOTEBOOK_REMOTE_STORE_HEADERS",
    }


def test_scrub_secrets() -> None:
    environ = {
        "STRATA_WORKER_TOKEN": "t",
        "STRATA_PROXY_TOKEN": "p",
        "STRATA_WORKER_MAX_CONCURRENT": "2",
        "PATH": "/bin",
    }
    removed = scrub_secrets(environ)
    assert removed == {"STRATA_WORKER_TOKEN": "t", "STRATA_PROXY_TOKEN": "p"}
    assert environ == {"STRATA_WORKER_MAX_CONCURRENT": "2", "PATH": "/bin"}
    assert scrub_secrets(environ) == {}


# ---- the status table (errors.py has no test file of its own) -------------------------


@pytest.mark.parametrize(
    ("exc", "status", "body"),
    [
        (BadRequest("bad"), 400, {"detail": "bad"}),
        (Unauthorized("no"), 401, {"detail": "no"}),
        (PayloadTooLarge("big"), 413, {"detail": "big"}),
        (CellTimedOut("slow"), 408, {"detail": "slow", "success": False, "error": "slow"}),
        (KernelCrashed("died"), 502, {"detail": "died", "success": False, "error": "died"}),
        (UpstreamFailed("up"), 502, {"detail": "up", "success": False, "error": "up"}),
        (WorkerBusy("full"), 503, {"detail": "full", "success": False, "error": "full"}),
        # a 500 has the reference's result shape too (its locked-environment failures)
        (WorkerError("odd"), 500, {"detail": "odd", "success": False, "error": "odd"}),
        (
            EnvironmentFailed("no uv"),
            500,
            {
                "detail": "locked environment: no uv",
                "success": False,
                "error": "locked environment: no uv",
            },
        ),
    ],
)
def test_error_response(exc: WorkerError, status: int, body: dict[str, object]) -> None:
    response = error_response(exc)
    assert (response.status_code, json.loads(bytes(response.body))) == (status, body)
    assert response.headers["content-type"] == "application/json"
    assert ("retry-after" in response.headers) == isinstance(exc, WorkerBusy)


def test_timeout_status_can_be_504() -> None:
    response = error_response(CellTimedOut("slow"), timeout_status=504)
    assert response.status_code == 504
    assert json.loads(bytes(response.body))["error"] == "slow"
    assert error_response(BadRequest("x"), timeout_status=504).status_code == 400
    with pytest.raises(ValueError):
        error_response(CellTimedOut("slow"), timeout_status=500)


def test_retry_after() -> None:
    assert error_response(WorkerBusy("full")).headers["retry-after"] == "5"
    busy = WorkerBusy("full", retry_after_seconds=12)
    assert busy.retry_after_seconds == 12
    assert error_response(busy).headers["retry-after"] == "12"


def test_subclass_takes_its_parents_status() -> None:
    class MissingInput(BadRequest):
        pass

    assert status_for(MissingInput("x")) == 400
    assert isinstance(MissingInput("x"), WorkerError)
    assert MissingInput("x").detail == "x"
