# @worker warm
# Forty listings to price. Everything below runs on the kernel worker.
import numpy as np
import pandas as pd

rng = np.random.default_rng(7)
listings = pd.DataFrame(
    {
        "area_m2": rng.uniform(30, 200, 40).round(1),
        "rooms": rng.integers(1, 7, 40),
        "age_years": rng.uniform(0, 80, 40).round(0),
        "distance_km": rng.uniform(1, 25, 40).round(1),
    }
)
print(f"{len(listings)} listings")
