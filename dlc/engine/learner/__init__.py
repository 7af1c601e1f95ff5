"""A learner's process: its actor and training loop, its start-up, pace, checkpoints, uplink and state copies."""
