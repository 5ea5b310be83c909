"""Run logging (``metrics.jsonl``, ``scores.jsonl``, TensorBoard, wandb) and video encoding."""
