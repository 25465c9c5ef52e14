"""PostgreSQL: connections, migrations, the run history written one transition at a time, and the claims
on tool calls. Independent of the consumer runtime (neither imports the other)."""
