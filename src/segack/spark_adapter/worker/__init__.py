"""The executors: a segment's task (its work package), the dispatcher that keeps many handler calls
in flight, the sequencing rules both keep, and the dead-letter retry's tasks. Sees the checkpoint only
through its narrow task view (:class:`~segack.spark_adapter.store.checkpoint.TaskStore`)."""
