"""Settings: the only package that reads the environment (``settings``), and who a process is to Kafka
(``kafka_auth``). Everything above takes its settings as arguments."""
