"""The recipe: one typed tree of a run's settings, strictly checked, its sections grouped by topic."""
