"""Decoupled DiLoCo: learners that never wait, and a syncer that merges their fragments in rounds."""
