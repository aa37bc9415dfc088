# @worker warm
# MODEL is not built here: the worker's preload (preload.py) built it once per kernel,
# so this cell only predicts.
priced = listings.assign(predicted_k=MODEL.predict(listings).round(1))
print(f"priced {len(priced)} listings with {MODEL.name}, trained at {MODEL.trained_at:.3f}")
