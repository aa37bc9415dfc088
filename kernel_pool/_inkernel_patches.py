"""Monkeypatches of much-patched standard library modules, undone by the reset.

Shipped into every kernel after ``_inkernel_modules.py``, into the same module (stdlib only).
A cell that replaces or deletes a function or class of one of these modules
(``time.time = frozen``, ``datetime.datetime = FakeDatetime``, ``warnings.warn = quiet``,
``ssl._create_default_https_context = ssl._create_unverified_context``,
``socket.getaddrinfo = ipv4_only``) would leave it so for every later request on the kernel;
a fresh interpreter, the reference's cell process, starts without it.
:func:`capture_module_patches` records their callables at the baseline,
:func:`restore_module_patches` puts back those a cell replaced and any attribute it deleted.
(``os``, ``io``, ``json``, ``pickle``, ``pathlib`` and ``builtins`` are guarded by
``_inkernel.py`` itself, even before the kernel replies.)

Only callables are compared: a module's data (caches, counters, a flag set on first use) is
its own business, and reading every value would cost a cache miss each (0.6 ms for the
9,000 values of the whole standard library, after a cell); these modules' callables take
about 60 us. Attributes a cell adds stay (a submodule imported later is one).
"""

_PATCHED_MODULES = (
    "time",
    "datetime",
    "random",
    "uuid",
    "math",
    "warnings",
    "socket",
    "ssl",
    "subprocess",
)
# (module __dict__, a copy of it, a getter of its callables, their values) at the baseline
_patchable = []


def capture_module_patches():
    """Record the callables of the modules above that are loaded now (the baseline)."""
    _patchable.clear()
    for name in _PATCHED_MODULES:
        module = sys.modules.get(name)  # noqa: F821 (sys from _inkernel.py)
        attributes = getattr(module, "__dict__", None)
        if not isinstance(attributes, dict):
            continue
        names = [key for key, value in attributes.items() if callable(value)]
        if len(names) < 2:  # itemgetter of one name gives the value, not a tuple
            names += ["__name__", "__name__"]
        get = operator.itemgetter(*names)  # noqa: F821 (operator from _inkernel_state.py)
        _patchable.append((attributes, dict(attributes), get, get(attributes)))


def restore_module_patches():
    """Put back each recorded callable a cell replaced, and each attribute it deleted."""
    for attributes, baseline, get, values in _patchable:
        if len(attributes) >= len(baseline) and _same(get, attributes, values):
            continue
        for key, value in baseline.items():
            current = attributes.get(key, _MISSING)  # noqa: F821 (from _inkernel.py)
            if current is not value and (current is _MISSING or callable(value)):  # noqa: F821
                attributes[key] = value


def _same(get, attributes, values):
    try:
        return get(attributes) == values  # identity first: an unchanged value's __eq__ is unused
    except Exception:  # a callable deleted, or a replacement whose __eq__ raises
        return False
