"""Package data: the embedded default tokenizer (built by scripts/build_tokenizer.py)."""
