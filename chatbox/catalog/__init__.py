"""The model catalogue: the manifest, the registry, GGUF files and their serving copies."""
