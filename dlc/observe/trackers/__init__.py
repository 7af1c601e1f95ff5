"""Experiment trackers (TensorBoard, W&B, MLflow) fed from what the run directory records."""

from dlc.observe.trackers.fanout import Trackers, check_trackers, default_trackers

__all__ = ["Trackers", "check_trackers", "default_trackers"]
