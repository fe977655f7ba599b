"""The driver: the entry points (:func:`~segack.spark_adapter.replay`,
:func:`~segack.spark_adapter.foreach_batch`), the run they coordinate once they hold the checkpoint,
its Spark jobs, the dead-letter retry and the planner. Imports from every other role."""
