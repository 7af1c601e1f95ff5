"""Keeping the run alive: the supervisor, recoveries, hot spares, and carrying out chaos through the node agents."""
