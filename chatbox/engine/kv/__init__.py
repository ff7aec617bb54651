"""The KV cache: slots and their streams, cached prefixes, forks, parking in RAM and on disk."""
