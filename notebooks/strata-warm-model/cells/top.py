# @worker warm
# A table (its last expression comes back as an HTML display), from the same warm MODEL.
sensitivity = MODEL.sensitivity(priced).round(2).to_dict()
print(f"sensitivity from the model trained at {MODEL.trained_at:.3f}: {sensitivity}")
top = priced.nlargest(5, "predicted_k").reset_index(drop=True)
top
