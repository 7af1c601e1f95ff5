"""The run-directory contract: the files a run writes and its views read, storage, checkpoints."""
