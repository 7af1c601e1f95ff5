"""The recipe: one typed tree of a run's settings, strictly checked, a module per section."""
