"""The local training loop and what it needs: the Trainer, the inner optimizer, the learning-rate
schedule, checkpoints, metrics, progress and the memory budget."""
