"""Worker preload for the ``strata-warm-model`` notebook: build the model once.

The kernel worker runs this file once, in the template every kernel is forked from::

    strata-kernel-worker --preload notebooks/strata-warm-model/preload.py

Every name defined here stays warm across requests: cells routed to the worker use
``MODEL`` directly, without paying the second or so it takes to build. It stands in for the
real thing (weights read from disk, a model moved onto a GPU): a ridge regression on random
Fourier features, fitted on synthetic house prices.
"""

from __future__ import annotations

import time

import matplotlib.pyplot as plt  # noqa: F401  (warm import for the chart cell)
import numpy as np
import pandas as pd

FEATURES = ("area_m2", "rooms", "age_years", "distance_km")
_LOW = np.array([25.0, 1.0, 0.0, 0.5])
_HIGH = np.array([220.0, 7.0, 90.0, 30.0])


def true_price_k(x: np.ndarray) -> np.ndarray:
    """The synthetic market the model learns: price in thousands."""
    area, rooms, age, distance = x.T
    return 4.2 * area * np.exp(-age / 120) * (1 + 0.04 * rooms) / (1 + 0.05 * distance)


class PriceModel:
    """Ridge regression on random Fourier features of the four listing features."""

    name = "price-rff-ridge"

    def __init__(self, n_components: int = 384, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.n_components = n_components
        self._w = rng.normal(scale=1.5, size=(len(FEATURES), n_components))
        self._b = rng.uniform(0, 2 * np.pi, size=n_components)
        self._coef = np.zeros(n_components)
        self._mean = 0.0
        self.trained_at: float | None = None
        self.train_rows = 0

    def _design(self, x: np.ndarray) -> np.ndarray:
        scaled = (x - _LOW) / (_HIGH - _LOW)
        return np.sqrt(2.0 / self.n_components) * np.cos(scaled @ self._w + self._b)

    def fit(self, x: np.ndarray, y: np.ndarray, alpha: float = 1e-3) -> PriceModel:
        z = self._design(x)
        self._mean = float(y.mean())
        gram = z.T @ z + alpha * np.eye(self.n_components)
        self._coef = np.linalg.solve(gram, z.T @ (y - self._mean))
        self.trained_at = time.time()
        self.train_rows = len(x)
        return self

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """Predicted prices (thousands) for a frame with the :data:`FEATURES` columns."""
        x = frame.loc[:, list(FEATURES)].to_numpy(dtype=float)
        return self._design(x) @ self._coef + self._mean

    def sensitivity(self, frame: pd.DataFrame) -> pd.Series:
        """How much the predicted price moves when each feature rises by 10 %."""
        base = self.predict(frame)
        moves = {}
        for feature in FEATURES:
            bumped = frame.assign(**{feature: frame[feature] * 1.1})
            moves[feature] = float(np.mean(self.predict(bumped) - base))
        return pd.Series(moves, name="change_k_per_10pct")


def _train() -> PriceModel:
    rng = np.random.default_rng(42)
    x = rng.uniform(_LOW, _HIGH, size=(15_000, len(FEATURES)))
    x[:, 1] = np.round(x[:, 1])
    y = true_price_k(x) + rng.normal(scale=8.0, size=len(x))
    return PriceModel().fit(x, y)


_started = time.perf_counter()
MODEL = _train()
MODEL_LOAD_SECONDS = round(time.perf_counter() - _started, 2)
del _started
