"""Side-by-side benchmarks of the warm pool and the worker (run ``python -m bench``).

Not part of the shipped packages: it drives ``kernel_pool`` in process and ``kernel_worker``
(plus the baselines) as real processes over loopback HTTP. See ``bench/README.md``.
"""

__all__: list[str] = []
