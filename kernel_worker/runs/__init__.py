"""One run directory, and what a cell leaves in it.

``directory`` makes, names, hands over and sweeps run directories; ``files`` reaches files
below a run without following links; ``layout`` checks what a cell broke there;
``display_files`` writes the displays' mime files; ``reuse`` keeps large files of finished
runs; ``output_dirs`` finds the ``# @output_dir`` folders; ``messages`` reduces IOPub into
console (``console``) and displays (``displays``); ``limits`` holds the caps on all of these.

May import ``agent`` (the formats the kernel side writes) and the shared ``errors``; nothing
else of the worker.
"""

__all__: list[str] = []
