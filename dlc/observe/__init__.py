"""What a user sees of a run: snapshots, goodput, the live console, experiment trackers, status, reports."""
