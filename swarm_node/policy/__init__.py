"""Model loading, generation backends, logprob scoring, the training step and checkpoints."""
