"""Training data: the byte corpus read into memory, tokenizers, and prepared token shards on disk."""
