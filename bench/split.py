"""One wide table vs the meta/data split: scenario `split`."""
