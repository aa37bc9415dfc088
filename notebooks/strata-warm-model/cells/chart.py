# @worker warm
# A chart: it comes back as a PNG display.
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 4))
points = ax.scatter(priced["area_m2"], priced["predicted_k"], c=priced["age_years"], cmap="viridis")
fig.colorbar(points, label="age (years)")
ax.set_xlabel("area (m²)")
ax.set_ylabel("predicted price (k)")
ax.set_title(f"{len(priced)} listings priced by {MODEL.name}")
plt.show()
