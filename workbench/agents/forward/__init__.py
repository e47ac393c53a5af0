"""An agent and its forward pass: the `Agent` record, token batches, log-probs, packed rows, shared text."""
