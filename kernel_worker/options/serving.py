"""Options of the worker as a server: where it listens, how it treats connections and
queued work, how it stops, and what it logs."""

from __future__ import annotations

from .environments import on_off
from .model import Option
from .parsing import (
    ENV_PREFIX,
    log_level,
    non_negative_int,
    peer_list,
    port,
    positive_int,
    positive_seconds,
    seconds,
    worker_id,
)

__all__ = ["OPTIONS"]

OPTIONS: tuple[Option, ...] = (
    Option(
        "--host",
        f"{ENV_PREFIX}HOST",
        str,
        "address to bind (default 127.0.0.1; 0.0.0.0 when a token is set)",
        default="`127.0.0.1` (`0.0.0.0` with a token)",
        details=("Address to bind."),
    ),
    Option(
        "--port",
        f"{ENV_PREFIX}PORT",
        port,
        "port to bind",
        details=("Port to bind."),
    ),
    Option(
        "--connect",
        f"{ENV_PREFIX}CONNECT",
        str,
        "bind no port: dial out to the relay at this ws:// or wss:// URL and serve the requests "
        "it forwards, redialling with backoff; the relay's token is read from "
        "STRATA_WORKER_CONNECT_TOKEN (--host and --port are then unused)",
        default="none",
        details=(
            "Bind no port: dial out to a relay at this `ws://` or `wss://` URL and serve the "
            "requests it forwards. See "
            "[Behind NAT: `--connect`](operations.md#behind-nat---connect)."
        ),
    ),
    Option(
        "--header-timeout",
        f"{ENV_PREFIX}HEADER_TIMEOUT",
        positive_seconds,
        "seconds a connection may take to send a request's headers, from its first byte (from the"
        " connection, for its first request); then it is closed",
        details=(
            "Seconds a connection may take to send a request's line and headers, counted from the"
            " connection's opening (its first request) or from the first byte of its next "
            "request; bytes that trickle in do not extend it. Then the connection is closed, "
            "after a `408` when part of a request came. The rest of a body that was answered "
            "without being read (a `401`, a `413`) may not pause this long either. Headers over "
            "64 KiB get `431`."
        ),
        setting="header_timeout_seconds",
    ),
    Option(
        "--max-connections",
        f"{ENV_PREFIX}MAX_CONNECTIONS",
        positive_int,
        "connections open at once; one more closes the one idle longest, or is answered 503 when "
        "every one has a request in flight",
        details=(
            "Connections open at once. One more closes the connection that has waited longest for"
            " a request (idle between requests, or still sending its headers); when every open "
            "one has a request in flight, the new one is answered `503` + `Retry-After: 5` and "
            "closed. So sockets that send nothing cannot keep `/health` or a cell out. The worker"
            " raises its soft open-file limit to fit this many beside its own files (and logs a "
            "warning, keeping fewer, when the hard limit does not allow it)."
        ),
    ),
    Option(
        "--send-timeout",
        f"{ENV_PREFIX}SEND_TIMEOUT",
        positive_seconds,
        "seconds a client may read nothing of an answer being sent; then the connection is closed"
        " and what the answer held is freed",
        details=(
            "Seconds a client may read nothing of an answer being sent (the socket's buffers "
            "full). Then the connection is closed and the answer stops: a bundle's run directory "
            "(hundreds of MB on the memory run root) is removed instead of staying pinned as long"
            " as the socket. A slow client that keeps reading is never cut off."
        ),
        setting="send_timeout_seconds",
    ),
    Option(
        "--body-timeout",
        f"{ENV_PREFIX}BODY_TIMEOUT",
        positive_seconds,
        "seconds an upload may send nothing before it is answered 408 and what it sent is removed",
        details=(
            "Seconds an upload may send nothing: then it is answered `408` and what it sent is "
            "removed (a stalled or abandoned client no longer holds a run directory and a "
            "connection). A slow upload that keeps sending is never cut off."
        ),
        setting="body_timeout_seconds",
    ),
    Option(
        "--max-uploads",
        f"{ENV_PREFIX}MAX_UPLOADS",
        positive_int,
        "push-model request bodies received at once; more get 503 + Retry-After",
        details=(
            "Push-model request bodies (`/v1/execute`, `/v1/notebook-execute`) received at once; "
            "more get `503` `Worker is receiving N of M uploads` + `Retry-After: 5`, before any "
            "of their body is read. Each upload holds a run directory (in memory by default) "
            "while it arrives, which `--max-concurrent` and `--queue-depth` (they count "
            "executions, admitted once the body is in) do not bound. `/health` reports "
            "`active_uploads` and `max_uploads`."
        ),
    ),
    Option(
        "--queue-wait",
        f"{ENV_PREFIX}QUEUE_WAIT",
        seconds,
        "seconds a request waits inline for a kernel; then it is answered 202 with a job URL to "
        "poll",
        details=(
            "Seconds a request waits inline for a kernel; then it is answered `202` with a job "
            "URL to poll."
        ),
        setting="queue_wait_seconds",
    ),
    Option(
        "--queue-depth",
        f"{ENV_PREFIX}QUEUE_DEPTH",
        non_negative_int,
        "executions that may wait for a kernel; more get 503 + Retry-After",
        details=("Executions that may wait for a kernel; more get `503` + `Retry-After`."),
    ),
    Option(
        "--max-concurrent",
        "STRATA_WORKER_MAX_CONCURRENT",
        positive_int,
        "executions admitted at once, running or waiting for a kernel; more get 503 + Retry-After"
        " (default: no cap but --queue-depth on those waiting)",
        default="none",
        details=(
            "Executions admitted at once, running or waiting for a kernel, as on the reference "
            "worker; more get `503` `Worker is running N of M executions` + `Retry-After: 5`. "
            "`/health` reports it as `max_concurrent` (else the pool size)."
        ),
    ),
    Option(
        "--job-ttl",
        f"{ENV_PREFIX}JOB_TTL",
        seconds,
        "seconds a finished job's result is kept for its poller",
        details=("Seconds a finished job's result is kept for its poller."),
        setting="job_ttl_seconds",
    ),
    Option(
        "--timeout-status",
        f"{ENV_PREFIX}TIMEOUT_STATUS",
        int,
        "HTTP status for a cell that times out: 408 (what Strata expects, default) or 504",
        default="`408`",
        details=(
            "Status for a timed-out cell: `408` (what Strata's client expects) or `504` (the "
            "protocol page)."
        ),
    ),
    Option(
        "--drain-seconds",
        f"{ENV_PREFIX}DRAIN_SECONDS",
        seconds,
        "on SIGTERM, how long executions in flight may finish while new ones get 503",
        details=(
            "On SIGTERM: new executions get `503` while those in flight finish, and the results "
            "of those answered `202` that a client is polling for wait for it, for up to this "
            "long; then kernels shut down and the worker exits 0. A second SIGTERM or SIGINT "
            "stops the wait at once: what is still running is cancelled (`409`) and the worker "
            "shuts down the same way. Either signal while the kernels are still starting (a long "
            "`--preload`) stops them and the worker at once. After the drain, answers still being"
            " sent get 5 s more: a client that stopped reading (or an upload that stopped "
            "sending) cannot hold the stop. Each signal is logged with what it starts."
        ),
    ),
    Option(
        "--drain-notice",
        f"{ENV_PREFIX}DRAIN_NOTICE",
        seconds,
        "on SIGTERM, how long /ready answers 503 while new cells are still taken, before the "
        "drain: a load balancer's health check takes the worker out first",
        details=(
            "On SIGTERM, before the drain: for this long `/ready` answers `503` while new cells "
            "are still taken, so a load balancer whose health check polls `/ready` stops sending"
            " cells before the worker would refuse them. Make it longer than the check's "
            "interval times its failure count, plus its timeout (see "
            "[A fleet behind a load balancer](deployment.md#a-fleet-behind-a-load-balancer)). "
            "A second signal ends it at once. The stop takes this much longer."
        ),
        setting="drain_notice_seconds",
    ),
    Option(
        "--worker-id",
        f"{ENV_PREFIX}WORKER_ID",
        worker_id,
        "this worker's name in a fleet, the start of each of its job ids (default: the host "
        "name and the port, e.g. gpu-3-9000)",
        default="host name and port",
        details=(
            "This worker's name in a fleet: 1 to 63 letters, digits and dashes. Every job id "
            "starts with it (`/v1/jobs/<worker-id>.<random>`), so a worker that gets a poll for"
            " a job of another forwards it to `--peers`, and one for a job of its own that it "
            "no longer holds answers `404` at once. The default, the host name (other "
            "characters become dashes) and the port, differs between workers on one host and "
            "between pods."
        ),
    ),
    Option(
        "--peers",
        f"{ENV_PREFIX}PEERS",
        peer_list,
        "the other workers behind the same load balancer, comma-separated: base URLs "
        "(http://10.0.0.2:9000) and dns:NAME:PORT (re-resolved every 5 s); polls and cancels "
        "for jobs held elsewhere are forwarded to them (default: none)",
        default="none",
        details=(
            "The workers behind the same load balancer, comma-separated: base URLs "
            "(`http://10.0.0.2:9000`, `https://w2.internal:9443`) and `dns:NAME:PORT` entries,"
            " each address the name resolves to (re-resolved every 5 s) as `http://ADDRESS:PORT`"
            " (a Kubernetes headless Service). A poll for another worker's job and a cancel for a"
            " build not running here are forwarded to every peer at once, with the client's "
            "`Authorization`; the holder's answer is passed back unchanged. Listing this worker "
            "itself is harmless. See "
            "[A fleet behind a load balancer](deployment.md#a-fleet-behind-a-load-balancer)."
        ),
    ),
    Option(
        "--heartbeat-seconds",
        "STRATA_WORKER_HEARTBEAT_SECONDS",
        positive_seconds,
        "POST /execute (strata-pool): an answer not ready within this interval is sent as a 200 "
        "that streams a space every interval, then the status and body in JSON (default: off)",
        default="off",
        details=(
            "For a proxy that ends silent requests (strata-pool): a `POST /execute` answer not "
            "ready within this interval becomes a `200` with `X-Strata-Status-In-Body: 1` that "
            'sends a space every interval, then `{"status_code", "content"}` (the answer\'s '
            "status, and its JSON body as a string). Quicker answers, refusals included, keep "
            "their own status; with it set, `/execute` waits for its run instead of answering "
            "`202`."
        ),
    ),
    Option(
        "--metrics-port",
        f"{ENV_PREFIX}METRICS_PORT",
        port,
        "also serve Prometheus /metrics without a token on this port (default: only the "
        "token-gated /metrics route)",
        default="none",
        details=(
            "Also serve Prometheus `/metrics` on this port without a token (`GET` and `HEAD` "
            "of `/metrics` only: another method there is `405` with `Allow: GET, HEAD`, "
            "another path `404`). It has the main port's "
            "`--header-timeout`, `--max-connections` (counted apart) and `--send-timeout`, so "
            "sockets held open on it cannot pile up. A port in use stops the start."
        ),
    ),
    Option(
        "--log-level",
        f"{ENV_PREFIX}LOG_LEVEL",
        log_level,
        "debug, info (default), warning or error",
        default="`info`",
        details=("`debug`, `info`, `warning`, `error`."),
    ),
    Option(
        "--log-format",
        f"{ENV_PREFIX}LOG_FORMAT",
        str,
        "'text' (default) or 'json' (JSON lines)",
        default="`text`",
        details=(
            "`text` or `json` (JSON lines). Every line of a request carries its request id (also "
            "sent back as `X-Request-Id`); cell source and values are never logged (a failed cell"
            " is logged by its exception's type: `the cell raised KeyError`), nor is what a "
            "cell's processes print. A worker bug answers `500` with `Internal error (request id "
            "…)` and is logged once, with its traceback, under that id (one that breaks an answer"
            " already under way cuts it off, and uvicorn logs it too). Python warnings are log "
            "lines too."
        ),
    ),
    Option(
        "--access-log-probes",
        f"{ENV_PREFIX}ACCESS_LOG_PROBES",
        on_off,
        "log successful GET/HEAD /ready and /health probes in the access log",
        details=(
            "A load balancer's health checks (one per 2 s per worker behind the documented "
            "HAProxy configuration) are left out of the access log: a `GET` or `HEAD` of "
            "`/ready` or `/health` that answers below `400` leaves no line. `on` logs them like "
            "any other request; a failing probe is always logged."
        ),
    ),
)
