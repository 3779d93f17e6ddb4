"""gradnode.node.train: one peer's training, no network. Model, data, the inner AdamW loop, the outer
step, the engine that turns them into rounds and updates, checkpoints, and the native codec kernel.
Imports protocol/ and node/config.py only."""
