"""One learner's computation in JAX and NumPy, with no Ray and no run directory."""
