"""Data: datasets (registry), the built-in synthetic generator (`reid.data.synthetic`), transforms, samplers, loaders."""
