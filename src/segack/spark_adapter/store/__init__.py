"""The durable protocol: the checkpoint's files and format, its storage backends, claims and fencing,
key-group tokens, and segment requests. Knows nothing of Spark."""
