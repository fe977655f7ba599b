"""Spark glue: sessions, the hash and segment columns computed in the JVM, the queries of a run (key
groups, verification, the resume filter, the job's shuffle and sort), and the executors' check."""
