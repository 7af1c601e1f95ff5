"""What a user sees of a run: snapshots, goodput, the live console, TensorBoard, status, reports."""
