"""The prompt pipeline: Conversation → stripped, rendered, tokenized prompt and its block hashes."""
