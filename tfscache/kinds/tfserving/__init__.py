"""TF Serving as a node kind: its ModelService client, its node adapter, its launcher."""
