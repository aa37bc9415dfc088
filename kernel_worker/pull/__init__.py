"""The pull model: a build manifest names URLs; the worker fetches and delivers.

``manifest`` parses ``POST /v1/execute-manifest`` and runs it; ``transfers`` downloads the
inputs and uploads the bundle, finalize and console; ``url_safety`` decides which URLs may be
reached and connects only there; ``headers`` is what a manifest may set on those requests;
``output_stream`` sends ``# @output_dir`` files as they settle.

May import the core (service, jobs, execution, state), ``protocol`` and ``runs``; never
``http``.
"""

__all__: list[str] = []
