"""The blocking baselines, data-parallel (dp) and blocking DiLoCo: learners wait at a barrier."""
