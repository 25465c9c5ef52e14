"""Settings: the only package that reads the environment. ``settings`` (what every command and service
starts from) and the other settings classes (``telemetry``, ``alerts``, ``quotas``, ``trtllm``) over the
parsers in ``env``; the local stack's files (``stack_state``); who a process is (``identity``) and what
that makes it to Kafka (``kafka_auth``); passwords masked in what is printed (``masking``). Everything
above takes its settings as arguments."""
