"""Kafka plumbing: the Avro codec and its schema registries, the schemas topic and the guard on what it
teaches, the topic catalogue and its contract (``channels``), claim checks for records too large for the
broker, the co-partitioning assignor and aiokafka workarounds. Knows events, not agent rules."""
