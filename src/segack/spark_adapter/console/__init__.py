"""What an operator watches a checkpoint through: its Prometheus metrics (reads the store only)."""
