"""mlreg's pipelines package: how a model version *moves* (storage, Triton, promotion)."""
