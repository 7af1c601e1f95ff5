"""What is done with a trained model afterwards: read back from a run's checkpoints, sampled, evaluated."""
