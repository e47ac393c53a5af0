"""Sizes and dtypes without loading weights: model shapes, the memory model, the precision policy."""
