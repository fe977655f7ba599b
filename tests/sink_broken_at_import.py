"""A handler module whose import raises, as a user's can: it builds a sink with a table name
:class:`~segack.sinks.SqlSink` refuses. ``segack`` must refuse it in one line, not a traceback."""

import sqlite3

from segack.sinks import SqlSink

sink = SqlSink(connect=lambda: sqlite3.connect(":memory:"), apply=lambda cursor, event: None,
               table="ledger positions")
