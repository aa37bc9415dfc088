"""The Strata notebook executor protocol (v1) served from warm Jupyter kernels."""

__version__ = "0.1.0"

__all__ = ["__version__"]
