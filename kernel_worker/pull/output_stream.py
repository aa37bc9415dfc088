"""Pull runs: ``# @output_dir`` files sent to ``output_file_url`` as they settle.

While the cell runs, each folder is scanned every ``poll_seconds``; a regular file whose
(size, mtime) did not change since the previous scan is POSTed as the raw body to
``<output_file_url>?folder=<name>&path=<relative path>``. After the cell a final pass sends
whatever changed. ``201`` means stored: the file is left out of the bundle and listed under
``output_dirs_streamed``; another 4xx means refused: it stays in the bundle and is not
retried; a 5xx or a transport error is retried on the next pass. Only the files the bundle
would carry are sent: at most ``max_files`` (``--max-output-dir-files``), all folders together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from urllib.parse import urlencode

import httpx

from ..cancellation import cancel_and_wait
from ..runs import output_dirs
from .transfers import file_chunks

log = logging.getLogger(__name__)

Version = tuple[int, int]  # (size, mtime_ns)


class OutputDirStreamer:
    """Uploads one run's output-folder files to the orchestrator's output-file URL."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        root: Path,
        names: tuple[str, ...],
        *,
        timeout_seconds: float = 30.0,
        max_files: int | None = None,
    ) -> None:
        self._client = client
        self._url = url
        self._root = root
        self._names = names
        self._timeout = timeout_seconds
        self._max_files = max_files
        self._seen: dict[tuple[str, str], Version] = {}
        self._stored: dict[tuple[str, str], Version] = {}
        self._refused: set[tuple[str, str]] = set()

    async def poll_forever(self, poll_seconds: float) -> None:
        """Send settled files every ``poll_seconds`` until cancelled."""
        while True:
            await asyncio.sleep(poll_seconds)  # a background pacing loop, off the request path
            await self.send(settled_only=True)

    async def send(self, *, settled_only: bool) -> None:
        """One pass: upload new or changed files (only settled ones when asked)."""
        current = await asyncio.to_thread(self._versions)
        for key, version in current.items():
            if key in self._refused or self._stored.get(key) == version:
                continue
            settled = self._seen.get(key) == version
            self._seen[key] = version
            if settled or not settled_only:
                await self._upload(key, version)

    def streamed(self) -> dict[str, list[str]]:
        """``{folder: [path, ...]}`` stored by the orchestrator and unchanged since; every
        declared folder is named, an empty one with no paths (as the reference lists it)."""
        current = self._versions()
        result: dict[str, list[str]] = {name: [] for name in self._names}
        for (folder, rel), version in sorted(self._stored.items()):
            if current.get((folder, rel)) == version:
                result.setdefault(folder, []).append(rel)
        return result

    def _versions(self) -> dict[tuple[str, str], Version]:
        versions: dict[tuple[str, str], Version] = {}
        found = output_dirs.versions_of(self._root, self._names, self._max_files)
        for folder, files in found.items():
            for rel, version in files.items():
                versions[(folder, rel)] = version
        return versions

    async def _upload(self, key: tuple[str, str], version: Version) -> None:
        folder, rel = key
        separator = "&" if "?" in self._url else "?"
        url = f"{self._url}{separator}{urlencode({'folder': folder, 'path': rel})}"
        try:
            response = await self._client.post(
                url,
                content=file_chunks(self._root, [output_dirs.FOLDER, folder, *rel.split("/")]),
                headers={"Content-Type": "application/octet-stream"},
                timeout=self._timeout,
            )
        except (httpx.HTTPError, OSError) as exc:  # OSError: gone, or a link, since listed
            log.debug("output file upload failed (will retry): %s", type(exc).__name__)
            return
        if response.status_code == 201:
            self._stored[key] = version
        elif 400 <= response.status_code < 500:
            self._refused.add(key)  # kept in the bundle, never retried
        else:
            log.debug("output file upload answered %d (will retry)", response.status_code)


@contextlib.asynccontextmanager
async def streaming(
    streamer: OutputDirStreamer | None, poll_seconds: float
) -> AsyncIterator[OutputDirStreamer | None]:
    """Run the streamer's polling while the block (the cell) runs; cancel it afterwards."""
    if streamer is None:
        yield None
        return
    task = asyncio.ensure_future(streamer.poll_forever(poll_seconds))
    try:
        yield streamer
    finally:
        await cancel_and_wait(task)


def without_streamed(
    listing: Mapping[str, Mapping[str, int]], streamed: Mapping[str, list[str]]
) -> dict[str, dict[str, int]]:
    """The output-folder listing minus what the orchestrator already stored."""
    return {
        folder: {rel: size for rel, size in files.items() if rel not in streamed.get(folder, [])}
        for folder, files in listing.items()
    }
