"""Prompt-lookup decoding: drafts, the speculative step, and what a guessed row costs."""
