"""Answer caches: the exact-match cache of deterministic API answers and the semantic
cache of first questions' answers."""
